"""Drums' metrics on cases (OSWorld agreement itself is tests/test_evaluation_parity.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.docfiles import docx_cases, odt_cases

from drums_osworld.evaluation import metrics as M
from drums_osworld.evaluation.metrics import METRICS, _docx_paragraph_texts, _fuzz_ratio, _odt_paragraph_texts
from drums_osworld.tasks import OSWORLD_METRICS


def write(tmp_path: Path, name: str, text: str, encoding: str = "utf-8") -> str:
    p = tmp_path / name
    p.write_text(text, encoding=encoding)
    return str(p)


def test_registry_names_are_osworld_metrics():
    assert set(METRICS) <= OSWORLD_METRICS
    assert {"exact_match", "check_include_exclude", "is_in_list", "compare_text_file", "infeasible",
            "compare_docx_files", "compare_csv"} <= set(METRICS)


def test_exact_match():
    assert M.exact_match("Directory exists.\n", {"expected": "Directory exists.\n"}) == 1.0
    assert M.exact_match("Directory exists.", {"expected": "Directory exists.\n"}) == 0.0
    assert M.exact_match(None, {"expected": None}) == 1.0
    assert M.exact_match([1, 2], {"expected": [1, 2]}) == 1.0
    with pytest.raises(KeyError):
        M.exact_match("x", {"expect": "x"})


def test_check_include_exclude():
    rules = {"include": ["executable"], "exclude": ["not-executable"]}
    assert M.check_include_exclude("executable\n", rules) == 1.0
    assert M.check_include_exclude("not-executable\n", rules) == 0.0
    assert M.check_include_exclude(None, rules) == 0.0
    assert M.check_include_exclude("", {}) == 1.0
    assert M.check_include_exclude("abc", {"include": ["a", "c"]}) == 1.0
    assert M.check_include_exclude("abc", {"include": ["a", "d"]}) == 0.0


def test_is_in_list_checks_the_expected_value_is_in_the_result():
    assert M.is_in_list("notes.txt\nreport.txt\n", {"expected": "report.txt"}) == 1.0
    assert M.is_in_list(["a", "b"], {"expected": "b"}) == 1.0
    assert M.is_in_list(["a", "b"], {"expected": "c"}) == 0.0
    with pytest.raises(TypeError):
        M.is_in_list(None, {"expected": "x"})


def test_match_in_list_checks_the_result_is_in_the_expected_list():
    assert M.match_in_list("b", {"expected": ["a", "b"]}) == 1.0
    assert M.match_in_list("c", {"expected": ["a", "b"]}) == 0.0


def test_literal_match():
    assert M.literal_match(1, "1") == 1.0
    assert M.literal_match("ABC", "abc", ignore_case=True) == 1.0
    assert M.literal_match("ABC", "abc") == 0.0
    assert M.literal_match(["A", 1], ("a", "1"), type="list", ignore_case=True) == 1.0
    assert M.literal_match(["A"], ["A", "B"], type="list") == 0.0
    with pytest.raises(NotImplementedError):
        M.literal_match(1, 1, type="dict")


def test_compare_text_file(tmp_path):
    gold = write(tmp_path, "gold.txt", "Hello from Drums\n")
    assert M.compare_text_file(write(tmp_path, "a.txt", "Hello from Drums\n"), gold) == 1.0
    assert M.compare_text_file(write(tmp_path, "b.txt", "Hello from Drums"), gold) == 0.0
    assert M.compare_text_file(str(tmp_path / "b.txt"), gold, ignore_blanks=True) == 1.0
    assert M.compare_text_file(write(tmp_path, "c.txt", "  hello\tfrom\n\nDRUMS "), gold,
                               ignore_blanks=True, ignore_case=True) == 1.0
    assert M.compare_text_file(None, gold) == 0.0
    assert M.compare_text_file("", gold) == 0.0
    with pytest.raises(TypeError):  # OSWorld only checks `actual`
        M.compare_text_file(str(tmp_path / "a.txt"), None)
    with pytest.raises(FileNotFoundError):
        M.compare_text_file(str(tmp_path / "missing.txt"), gold)


def test_diff_text_file(tmp_path):
    a = write(tmp_path, "a.txt", "1\n2\n3\n4\n")
    b = write(tmp_path, "b.txt", "1\n2\n3\n5\n")
    assert M.diff_text_file(a, a) == 1.0
    assert M.diff_text_file(a, b) == 0.75
    assert M.diff_text_file(None, b) == 0.0


def test_check_list(tmp_path):
    f = write(tmp_path, "out.txt", "org.openoffice.languagetool.oxt\nother\n")
    assert M.check_list(f, {"expect": [r"languagetool\.oxt"]}) == 1.0
    assert M.check_list(f, {"expect": [r"languagetool\.oxt"], "unexpect": ["other"]}) == 0.0
    assert M.check_list(f, {"expect": ["missing"]}) == 0.0
    assert M.check_list(None, {}) == 0.0


def test_check_csv(tmp_path):
    f = write(tmp_path, "t.csv", "name,score\nAda,91\nGrace,88\n")
    assert M.check_csv(f, {"expect": [{"name": "Ada", "score": "91"}]}) == 1.0
    assert M.check_csv(f, {"expect": [{"name": "Ada"}], "unexpect": [{"name": "Grace"}]}) == 0.0
    assert M.check_csv(None, {}) == 0.0


def test_file_contains(tmp_path):
    f = write(tmp_path, "f.txt", "alpha beta")
    assert M.file_contains(f, {"expected": ["alpha", "beta"]}) == 1.0
    assert M.file_contains(f, {"expected": ["gamma"]}) == 0.0
    assert M.file_contains(str(tmp_path / "missing"), {"expected": []}) == 0.0
    assert M.file_contains(None, {"expected": []}) == 0.0


def test_compare_csv(tmp_path):
    gold = write(tmp_path, "gold.csv", "Name,Score\nAda,91\n")
    assert M.compare_csv(write(tmp_path, "a.csv", "Name,Score\nAda,91"), gold) == 1.0  # splitlines
    assert M.compare_csv(write(tmp_path, "b.csv", "Name;Score\nAda;91\n"), gold) == 0.0
    assert M.compare_csv(write(tmp_path, "c.csv", " Name,Score \nAda,91\n"), gold) == 0.0
    assert M.compare_csv(str(tmp_path / "c.csv"), gold, strict=False) == 1.0
    assert M.compare_csv(write(tmp_path, "d.csv", "NAME,score\nada,91\n"), gold, ignore_case=True) == 1.0
    assert M.compare_csv(str(tmp_path / "a.csv"), [str(tmp_path / "nope.csv"), gold]) == 1.0
    assert M.compare_csv(str(tmp_path / "a.csv"), str(tmp_path / "nope.csv")) == 0.0
    assert M.compare_csv(str(tmp_path / "missing.csv"), gold) == 0.0
    assert M.compare_csv(None, gold) == 0.0
    latin = write(tmp_path, "latin.csv", "Name,Score\nAd\u00e9,91\n", encoding="latin-1")
    # each file is decoded on its own (utf-8, then latin-1...), so the texts match
    assert M.compare_csv(latin, write(tmp_path, "utf.csv", "Name,Score\nAd\u00e9,91\n")) == 1.0
    assert M.compare_csv(latin, latin) == 1.0


def test_fuzz_ratio_is_rapidfuzz_ratio():
    assert _fuzz_ratio("", "") == 100.0
    assert _fuzz_ratio("a", "") == 0.0
    assert _fuzz_ratio("abc", "abd") == pytest.approx(66.66666666666667)
    assert _fuzz_ratio("Drums was here", "Drums were here") == pytest.approx(82.75862068965517)
    assert _fuzz_ratio(None, "x") == 0.0
    assert M.fuzzy_match("kitten", {"expected": "sitting"}) == pytest.approx(_fuzz_ratio("kitten", "sitting") / 100)


def test_docx_paragraph_texts(tmp_path):
    files = docx_cases(tmp_path)
    assert _docx_paragraph_texts(files["plain"]) == ["Hello", "World"]
    assert _docx_paragraph_texts(files["inner"]) == [
        "a\tb\ncd\n-\t", "linked textafter", "tabs in pPr", "kept"]
    assert _docx_paragraph_texts(files["empty"]) == []
    assert _docx_paragraph_texts(files["other_target"]) == ["Hello", "World"]
    with pytest.raises(ValueError):
        _docx_paragraph_texts(files["not_word"])


def test_odt_paragraph_texts(tmp_path):
    files = odt_cases(tmp_path)
    assert _odt_paragraph_texts(files["plain"]) == ["Hello", "World"]
    assert _odt_paragraph_texts(files["spans"]) == ["Hello", "World"]
    assert _odt_paragraph_texts(files["dropped"]) == [
        "abcdes1s2s3f", "cell", "noteend", "in note", "x&y <z>"]
    assert _odt_paragraph_texts(files["header"]) == ["Hello", "World", "Header text"]
    assert _odt_paragraph_texts(files["no_styles_in_manifest"]) == ["Hello"]
    assert _odt_paragraph_texts(files["missing_styles"]) == ["Hello", "World"]


def test_compare_docx_files(tmp_path):
    d = docx_cases(tmp_path / "d")
    o = odt_cases(tmp_path / "o")
    assert M.compare_docx_files(d["plain"], d["plain_split_runs"]) == 1
    assert M.compare_docx_files(d["plain"], d["order"]) == 0
    assert M.compare_docx_files(d["plain"], d["order"], ignore_order=True) == 1
    assert M.compare_docx_files(d["plain"], d["plain_extra_spaces"]) == 1          # ignore_blanks default
    assert M.compare_docx_files(d["plain"], d["plain_extra_spaces"], ignore_blanks=False) == 0
    assert M.compare_docx_files(d["plain"], d["plain_case"]) == 0
    assert M.compare_docx_files(d["plain"], d["plain_case"], ignore_case=True) == 1
    assert M.compare_docx_files(d["plain"], d["empty_line"], ignore_blanks=False) == 0
    assert M.compare_docx_files(d["plain"], d["empty_line"], ignore_blanks=False, delete_empty_lines=True) == 1
    assert 0 < M.compare_docx_files(d["plain"], d["plain_case"], content_only=True) < 1
    assert M.compare_docx_files(d["plain"], d["not_word"]) == 0
    assert M.compare_docx_files(d["plain"], o["plain"]) == 0                       # mixed types
    assert M.compare_docx_files(d["plain"], str(tmp_path / "missing.docx")) == 0
    assert M.compare_docx_files(None, d["plain"]) == 0
    assert M.compare_docx_files(o["plain"], o["spans"]) == 1
    assert M.compare_docx_files(o["plain"], o["header"]) == 0
    assert M.compare_docx_files(o["plain"], o["missing_styles"]) == 1
    assert M.compare_docx_files(o["empty"], o["empty"], ignore_blanks=False, fuzzy_match=True) == 1.0


def test_infeasible_is_never_a_score():
    assert M.infeasible() is None
