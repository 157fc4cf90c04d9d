"""Drums' implementations of OSWorld 1.0.2 metrics, with the same names, signatures and results.

Each function mirrors the one of the same name in ``desktop_env.evaluators.metrics`` (desktop-env
1.0.2, Apache-2.0), including its quirks (``is_in_list`` checks that the *expected* value is in the
result; ``compare_text_file`` only checks that ``actual`` is set; ``compare_csv`` treats a missing
expected file as a mismatch), so a score here equals OSWorld's on the same inputs;
``tests/test_evaluation_parity.py`` checks that against the real package.

Only the standard library is used: ``compare_docx_files`` reads ``.docx`` paragraphs as python-docx
1.x does and ``.odt`` paragraphs as odfpy 1.4 does, and ``fuzz.ratio`` is rapidfuzz's Indel ratio.
"""
from __future__ import annotations

import csv
import difflib
import logging
import re
import zipfile
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

logger = logging.getLogger("drums.osworld.metrics")

__all__ = [
    "METRICS",
    "check_csv",
    "check_include_exclude",
    "check_list",
    "compare_csv",
    "compare_docx_files",
    "compare_text_file",
    "diff_text_file",
    "exact_match",
    "file_contains",
    "fuzzy_match",
    "infeasible",
    "is_in_list",
    "literal_match",
    "match_in_list",
]


# -- metrics.general -------------------------------------------------------------------------
def check_include_exclude(result: str, rules: dict[str, list[str]]) -> float:
    if result is None:
        return 0.0
    include = rules.get("include", [])
    exclude = rules.get("exclude", [])
    if all(r in result for r in include) and all(r not in result for r in exclude):
        return 1.0
    return 0.0


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    expect = rules["expected"]
    logger.debug("exact_match %r %r", result, expect)
    return 1.0 if result == expect else 0.0


def match_in_list(result: Any, rules: dict[str, Any]) -> float:
    expect = rules["expected"]
    return 1.0 if result in expect else 0.0


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    literal_type = options.get("type", "str")
    if literal_type == "str":
        ignore_case = options.get("ignore_case", False)
        score = (str(result) == str(expected)) if not ignore_case \
            else (str(result).lower() == str(expected).lower())
        return float(score)
    if literal_type == "list":
        if type(result) not in [list, tuple] or type(expected) not in [list, tuple] \
                or len(result) != len(expected):
            return 0.0
        ignore_case = options.get("ignore_case", False)
        result = [str(s) for s in result] if not ignore_case else [str(s).lower() for s in result]
        expected = [str(s) for s in expected] if not ignore_case else [str(s).lower() for s in expected]
        return float(result == expected)
    raise NotImplementedError(f"Type {type} not supported")  # sic: OSWorld formats the builtin


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    """1.0 when ``rules["expected"]`` is in ``result`` (an element of a list, or a substring)."""
    expect = rules["expected"]
    return 1.0 if expect in result else 0.0


def diff_text_file(result: str, expect: str) -> float:
    if result is None:
        return 0.0
    with open(result) as f:
        result_lines = f.read().splitlines()
    with open(expect) as f:
        expected_lines = f.read().splitlines()
    return difflib.SequenceMatcher(a=result_lines, b=expected_lines).ratio()


def fuzzy_match(result: Any, rules: dict[str, Any]) -> float:
    expect = rules["expected"]
    return _fuzz_ratio(result, expect) / 100.0


def _match_record(pattern: dict[str, Any], item: dict[str, Any]) -> bool:
    return all(k in item and item[k] == val for k, val in pattern.items())


def check_csv(result: str, rules: dict[str, list[dict[str, str]]]) -> float:
    if result is None:
        return 0.0
    expect_metrics = [False] * len(rules.get("expect", []))
    unexpect_metric = True
    with open(result) as f:
        reader = csv.DictReader(f)
        for rcd in reader:
            for i, r in enumerate(rules.get("expect", [])):
                expect_metrics[i] = expect_metrics[i] or _match_record(r, rcd)
            unexpect_metric = unexpect_metric and not any(
                _match_record(r, rcd) for r in rules.get("unexpect", []))
    return float(all(expect_metrics) and unexpect_metric)


def check_list(result: str, rules: dict[str, list[str]]) -> float:
    if result is None:
        return 0.0
    expect_patterns = [re.compile(ptt) for ptt in rules.get("expect", [])]
    unexpect_patterns = [re.compile(ptt) for ptt in rules.get("unexpect", [])]
    expect_metrics = [False] * len(expect_patterns)
    unexpect_metric = True
    with open(result) as f:
        for line in f:
            for i, r in enumerate(expect_patterns):
                expect_metrics[i] = expect_metrics[i] or (r.search(line) is not None)
            unexpect_metric = unexpect_metric and all(r.search(line) is None for r in unexpect_patterns)
    return float(all(expect_metrics) and unexpect_metric)


def file_contains(file_path: str, config: dict[str, Any]) -> float:
    if not file_path:
        return 0.0
    try:
        with open(file_path) as f:
            file_text = f.read()
        for text in config["expected"]:
            if text not in file_text:
                return 0.0
    except Exception:  # noqa: BLE001 - OSWorld's bare except: any failure scores 0
        return 0.0
    return 1.0


# -- metrics.vscode --------------------------------------------------------------------------
def compare_text_file(actual: str, expected: str, **options: Any) -> float:
    if not actual:
        return 0.0
    with open(actual) as f1:
        actual_text = f1.read()
    with open(expected) as f2:
        expected_text = f2.read()
    if options.get("ignore_blanks", False):
        actual_text = re.sub(r"[\t\n]", " ", actual_text).strip()
        actual_text = re.sub(r"\s+", " ", actual_text)
        expected_text = re.sub(r"[\t\n]", " ", expected_text).strip()
        expected_text = re.sub(r"\s+", " ", expected_text)
    if options.get("ignore_case", False):
        actual_text = actual_text.lower()
        expected_text = expected_text.lower()
    return 1.0 if actual_text == expected_text else 0.0


# -- metrics.table ---------------------------------------------------------------------------
_ENCODINGS = ("utf-8", "utf-8-sig", "latin-1", "windows-1252", "gbk", "cp1251", "iso-8859-1")


def _safe_read_file(file_path: str) -> list[str]:
    last_error: Exception | None = None
    for encoding in _ENCODINGS:
        try:
            with open(file_path, encoding=encoding) as f:
                return f.read().splitlines()
        except UnicodeDecodeError as e:
            last_error = e
            continue
    try:
        with open(file_path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except Exception as e:  # noqa: BLE001
        raise OSError(f"Cannot read file {file_path} with any supported encoding") from (last_error or e)


def compare_csv(result: str, expected: str | list[str], **options: Any) -> float:
    if result is None:
        return 0.0
    try:
        result_lines = _safe_read_file(result)
    except OSError:
        return 0.0
    expected_files = [expected] if isinstance(expected, str) else expected
    for expected_file in expected_files:
        try:
            expected_lines = _safe_read_file(expected_file)
            cur_result: Any = result_lines
            cur_expected: Any = expected_lines
            if not options.get("strict", True):
                cur_result = map(str.strip, cur_result)
                cur_expected = map(str.strip, cur_expected)
            if options.get("ignore_case", False):
                cur_result = map(str.lower, cur_result)
                cur_expected = map(str.lower, cur_expected)
            if list(cur_result) == list(cur_expected):
                return 1.0
        except OSError:
            continue
    return 0.0


# -- metrics.docs ----------------------------------------------------------------------------
def compare_docx_files(file1: str, file2: str, **options: Any) -> float:
    ignore_blanks = options.get("ignore_blanks", True)
    ignore_case = options.get("ignore_case", False)
    ignore_order = options.get("ignore_order", False)
    content_only = options.get("content_only", False)
    fuzzy_match = options.get("fuzzy_match", False)
    delete_empty_lines = options.get("delete_empty_lines", False)

    if not file1 or not file2:
        return 0

    if file1.endswith(".docx") and file2.endswith(".docx"):
        reader: Callable[[str], list[str]] = _docx_paragraph_texts
    elif file1.endswith(".odt") and file2.endswith(".odt"):
        reader = _odt_paragraph_texts
    else:
        return 0
    try:
        doc1_paragraphs = reader(file1)
        doc2_paragraphs = reader(file2)
    except Exception as e:  # noqa: BLE001 - OSWorld scores any load failure 0
        logger.info("compare_docx_files: cannot read a document: %s", e)
        return 0
    if ignore_order:
        doc1_paragraphs = sorted(doc1_paragraphs)
        doc2_paragraphs = sorted(doc2_paragraphs)
    if delete_empty_lines:
        doc1_paragraphs = [p for p in doc1_paragraphs if p.strip()]
        doc2_paragraphs = [p for p in doc2_paragraphs if p.strip()]

    if content_only:
        text1 = re.sub(r"\s+", " ", "\n".join(doc1_paragraphs)).strip()
        text2 = re.sub(r"\s+", " ", "\n".join(doc2_paragraphs)).strip()
        if ignore_case:
            text1, text2 = text1.lower(), text2.lower()
        return _fuzz_ratio(text1, text2) / 100.0

    if ignore_blanks:
        text1 = re.sub(r"\s+", " ", "\n".join(doc1_paragraphs)).strip()
        text2 = re.sub(r"\s+", " ", "\n".join(doc2_paragraphs)).strip()
        if ignore_case:
            text1, text2 = text1.lower(), text2.lower()
        if fuzzy_match:
            return _fuzz_ratio(text1, text2) / 100.0
        if text1 != text2:
            return 0
    else:
        if len(doc1_paragraphs) != len(doc2_paragraphs):
            return 0
        if fuzzy_match:
            total_similarity = 0.0
            if not doc1_paragraphs:
                return 1.0
            for p1, p2 in zip(doc1_paragraphs, doc2_paragraphs, strict=True):
                if ignore_case:
                    p1, p2 = p1.lower(), p2.lower()
                total_similarity += _fuzz_ratio(p1, p2) / 100.0
            return total_similarity / len(doc1_paragraphs)
        for p1, p2 in zip(doc1_paragraphs, doc2_paragraphs, strict=True):
            if ignore_case:
                p1, p2 = p1.lower(), p2.lower()
            if p1 != p2:
                return 0
    return 1


def infeasible() -> None:
    """Never called: ``evaluate`` scores infeasible tasks from the last action alone."""


# -- helpers: rapidfuzz's fuzz.ratio ---------------------------------------------------------
def _lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence (Hyyro's bit-parallel algorithm)."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        m = masks.get(ch, 0)
        u = v & m
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def _fuzz_ratio(s1: Any, s2: Any) -> float:
    """``rapidfuzz.fuzz.ratio``: the normalized Indel similarity of two strings, 0..100."""
    if s1 is None or s2 is None:
        return 0.0
    lensum = len(s1) + len(s2)
    if lensum == 0:
        return 100.0
    dist = lensum - 2 * _lcs_length(s1, s2)
    return (1.0 - dist / lensum) * 100.0


# -- helpers: documents ------------------------------------------------------------------------
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_PKG_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
_CT = "{http://schemas.openxmlformats.org/package/2006/content-types}"
_OFFICE_DOCUMENT = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument"
_STRICT_OFFICE_DOCUMENT = "http://purl.oclc.org/ooxml/officeDocument/relationships/officeDocument"
_WML_MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"


def _docx_paragraph_texts(path: str) -> list[str]:
    """``[p.text for p in docx.Document(path).paragraphs]`` as python-docx 1.x computes it."""
    with zipfile.ZipFile(path) as z:
        rels = ET.fromstring(z.read("_rels/.rels"))
        target = None
        for rel in rels.iter(f"{_PKG_REL}Relationship"):
            if rel.get("Type") in (_OFFICE_DOCUMENT, _STRICT_OFFICE_DOCUMENT) \
                    and rel.get("TargetMode", "Internal") != "External":
                target = rel.get("Target")
                break
        if target is None:
            raise ValueError("no main document part")
        partname = "/" + target.lstrip("/")
        types = ET.fromstring(z.read("[Content_Types].xml"))
        content_type = None
        for o in types.iter(f"{_CT}Override"):
            if (o.get("PartName") or "").lower() == partname.lower():
                content_type = o.get("ContentType")
        if content_type is None:
            ext = partname.rsplit(".", 1)[-1].lower()
            for d in types.iter(f"{_CT}Default"):
                if (d.get("Extension") or "").lower() == ext:
                    content_type = d.get("ContentType")
        if content_type != _WML_MAIN:
            raise ValueError(f"not a Word file, content type is {content_type!r}")
        root = ET.fromstring(z.read(partname.lstrip("/")))
    body = root.find(f"{_W}body")
    if body is None:
        return []
    return [_docx_p_text(p) for p in body.findall(f"{_W}p")]


def _docx_run_text(r: ET.Element) -> str:
    out = []
    for e in r:
        tag = e.tag
        if tag == f"{_W}t":
            out.append(e.text or "")
        elif tag in (f"{_W}tab", f"{_W}ptab"):
            out.append("\t")
        elif tag == f"{_W}cr":
            out.append("\n")
        elif tag == f"{_W}br":
            out.append("\n" if e.get(f"{_W}type", "textWrapping") == "textWrapping" else "")
        elif tag == f"{_W}noBreakHyphen":
            out.append("-")
    return "".join(out)


def _docx_p_text(p: ET.Element) -> str:
    out = []
    for e in p:
        if e.tag == f"{_W}r":
            out.append(_docx_run_text(e))
        elif e.tag == f"{_W}hyperlink":
            out.extend(_docx_run_text(r) for r in e.findall(f"{_W}r"))
    return "".join(out)


_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_MANIFEST = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"
# odfpy's LoadParser only builds elements inside these office:* elements.
_ODF_TRIGGERS = frozenset(f"{{{_OFFICE}}}{n}" for n in (
    "automatic-styles", "body", "font-face-decls", "master-styles", "meta", "scripts", "settings", "styles"))
_ODF_PREFIXES = ("meta", "config", "dc", "style", "svg", "fo", "draw", "table", "form")


def _odf_fix_xml_part(xmlpart: str) -> str:
    """odfpy's ``__fixXmlPart``: declare commonly missing namespace prefixes."""
    result = xmlpart
    for prefix in _ODF_PREFIXES:
        if f" xmlns:{prefix}" not in xmlpart:
            pos = result.find(" xmlns:")
            if pos >= 0:
                decl = f' xmlns:{prefix}="urn:oasis:names:tc:opendocument:xmlns:{prefix}:1.0"'
                result = result[:pos] + decl + result[pos:]
    return result


def _odt_paragraph_texts(path: str) -> list[str]:
    """OSWorld's ``get_paragraph_texts_odt(odf.opendocument.load(path))``.

    Every ``text:p`` in load order (settings, meta, content, then styles), each as its direct text
    plus the direct text of its direct ``text:span`` children (``text:s``, tabs, links are dropped).
    """
    import io

    paragraphs: list[ET.Element] = []
    with zipfile.ZipFile(path) as z:
        manifest = ET.fromstring(z.read("META-INF/manifest.xml"))
        listed = {e.get(f"{{{_MANIFEST}}}full-path") for e in manifest.iter(f"{{{_MANIFEST}}}file-entry")}
        for part in ("settings.xml", "meta.xml", "content.xml", "styles.xml"):
            if part not in listed:
                continue
            try:
                data = z.read(part).decode("utf-8")
            except KeyError:
                continue
            data = _odf_fix_xml_part(data)
            found: list[ET.Element] = []
            parse = False
            try:
                for event, elem in ET.iterparse(io.BytesIO(data.encode("utf-8")), events=("start", "end")):
                    if event == "start":
                        if elem.tag in _ODF_TRIGGERS:
                            parse = True
                        if part != "styles.xml" and elem.tag == f"{{{_OFFICE}}}font-face-decls":
                            parse = False
                        if parse and elem.tag == f"{{{_TEXT}}}p":
                            found.append(elem)
                    elif parse and elem.tag in _ODF_TRIGGERS:
                        parse = False
            except ET.ParseError:
                logger.info("compare_docx_files: %s of %s does not parse; skipped as odfpy does", part, path)
            paragraphs.extend(found)
    return [_odt_p_text(p) for p in paragraphs]


def _odt_p_text(p: ET.Element) -> str:
    parts = [p.text or ""]
    for child in p:
        if child.tag == f"{{{_TEXT}}}span":
            parts.append(child.text or "")
            parts.extend(grand.tail or "" for grand in child)
        parts.append(child.tail or "")
    return "".join(parts)


#: Metric name -> function, as ``getattr(desktop_env.evaluators.metrics, name)`` resolves it.
METRICS: dict[str, Callable[..., Any]] = {
    "check_csv": check_csv,
    "check_include_exclude": check_include_exclude,
    "check_list": check_list,
    "compare_csv": compare_csv,
    "compare_docx_files": compare_docx_files,
    "compare_text_file": compare_text_file,
    "diff_text_file": diff_text_file,
    "exact_match": exact_match,
    "file_contains": file_contains,
    "fuzzy_match": fuzzy_match,
    "infeasible": infeasible,
    "is_in_list": is_in_list,
    "literal_match": literal_match,
    "match_in_list": match_in_list,
}
