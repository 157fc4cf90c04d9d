"""Test helpers: write small .docx and .odt files by hand (zip + XML), with the constructs that
decide paragraph text (tabs, breaks, hyperlinks, spans, spaces, headers, tables, notes)."""
from __future__ import annotations

import zipfile
from pathlib import Path

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
WML_MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"


def w_run(text: str = "", *extra: str) -> str:
    t = f'<w:t xml:space="preserve">{text}</w:t>' if text else ""
    return f"<w:r>{t}{''.join(extra)}</w:r>"


def w_p(*inner: str) -> str:
    return f"<w:p>{''.join(inner)}</w:p>"


def make_docx(path: str | Path, body: list[str] | str, *, content_type: str = WML_MAIN,
              target: str = "word/document.xml") -> str:
    body_xml = body if isinstance(body, str) else "".join(body)
    document = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                f'<w:document xmlns:w="{W_NS}" xmlns:r="{R_NS}"><w:body>{body_xml}'
                f'<w:sectPr/></w:body></w:document>')
    types = ('<?xml version="1.0" encoding="UTF-8"?>'
             '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
             '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
             '<Default Extension="xml" ContentType="application/xml"/>'
             f'<Override PartName="/{target}" ContentType="{content_type}"/></Types>')
    rels = ('<?xml version="1.0" encoding="UTF-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            f'<Relationship Id="rId1" Type="{R_NS}/officeDocument" Target="{target}"/></Relationships>')
    doc_rels = ('<?xml version="1.0" encoding="UTF-8"?>'
                '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                '<Relationship Id="rIdLink" Type="' + R_NS + '/hyperlink" Target="https://example.org" '
                'TargetMode="External"/></Relationships>')
    folder, name = target.rsplit("/", 1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", types)
        z.writestr("_rels/.rels", rels)
        z.writestr(target, document)
        z.writestr(f"{folder}/_rels/{name}.rels", doc_rels)
    return str(path)


ODF_NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "dc": "http://purl.org/dc/elements/1.1/",
    "meta": "urn:oasis:names:tc:opendocument:xmlns:meta:1.0",
}
_DECLS = " ".join(f'xmlns:{k}="{v}"' for k, v in ODF_NS.items())


def make_odt(path: str | Path, body: str, *, master: str = "", manifest_parts=("content.xml", "styles.xml"),
             styles_in_zip: bool = True) -> str:
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_DECLS} office:version="1.3">'
               f'<office:automatic-styles/><office:body><office:text>{body}</office:text></office:body>'
               f'</office:document-content>')
    styles = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-styles {_DECLS} office:version="1.3">'
              f'<office:styles/><office:master-styles>{master}</office:master-styles></office:document-styles>')
    entries = "".join(f'<manifest:file-entry manifest:full-path="{p}" manifest:media-type="text/xml"/>'
                      for p in manifest_parts)
    manifest = ('<?xml version="1.0" encoding="UTF-8"?>'
                '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
                'manifest:version="1.3"><manifest:file-entry manifest:full-path="/" '
                'manifest:media-type="application/vnd.oasis.opendocument.text"/>' + entries + '</manifest:manifest>')
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.text")
        z.writestr("content.xml", content)
        if styles_in_zip:
            z.writestr("styles.xml", styles)
        z.writestr("META-INF/manifest.xml", manifest)
    return str(path)


def docx_cases(d: Path) -> dict[str, str]:
    """Named .docx files covering what python-docx's paragraph text depends on."""
    d.mkdir(parents=True, exist_ok=True)
    link = f'<w:hyperlink r:id="rIdLink">{w_run("linked")}{w_run(" text")}</w:hyperlink>'
    return {
        "plain": make_docx(d / "plain.docx", [w_p(w_run("Hello")), w_p(w_run("World"))]),
        "plain_split_runs": make_docx(d / "plain_split_runs.docx", [w_p(w_run("Hel"), w_run("lo")),
                                                                    w_p(w_run("World"))]),
        "plain_extra_spaces": make_docx(d / "plain_extra_spaces.docx", [w_p(w_run("Hello  ")),
                                                                        w_p(w_run(" World"))]),
        "plain_case": make_docx(d / "plain_case.docx", [w_p(w_run("HELLO")), w_p(w_run("world"))]),
        "order": make_docx(d / "order.docx", [w_p(w_run("World")), w_p(w_run("Hello"))]),
        "empty_line": make_docx(d / "empty_line.docx", [w_p(w_run("Hello")), w_p(), w_p(w_run("World"))]),
        "inner": make_docx(d / "inner.docx", [
            w_p(w_run("a", "<w:tab/>"), w_run("b", "<w:br/>"), w_run("c", '<w:br w:type="page"/>'),
                w_run("d", "<w:cr/>", "<w:noBreakHyphen/>", "<w:ptab/>", "<w:softHyphen/>")),
            w_p(link, w_run("after")),
            w_p("<w:pPr><w:tabs><w:tab w:val='left' w:pos='100'/></w:tabs></w:pPr>", w_run("tabs in pPr")),
            "<w:tbl><w:tr><w:tc>" + w_p(w_run("in a table")) + "</w:tc></w:tr></w:tbl>",
            w_p("<w:ins>" + w_run("inserted") + "</w:ins>", w_run("kept")),
        ]),
        "inner_fuzzy": make_docx(d / "inner_fuzzy.docx", [
            w_p(w_run("a", "<w:tab/>"), w_run("b", "<w:br/>"), w_run("c")),
            w_p(w_run("linked text after")),
        ]),
        "empty": make_docx(d / "empty.docx", []),
        "not_word": make_docx(d / "not_word.docx", [w_p(w_run("Hello"))],
                              content_type="application/vnd.ms-word.template.macroEnabledTemplate.main+xml"),
        "other_target": make_docx(d / "other_target.docx", [w_p(w_run("Hello")), w_p(w_run("World"))],
                                  target="word/document2.xml"),
    }


def odt_cases(d: Path) -> dict[str, str]:
    """Named .odt files covering what odfpy's ``getElementsByType(P)`` and OSWorld's text join see."""
    d.mkdir(parents=True, exist_ok=True)
    return {
        "plain": make_odt(d / "plain.odt", "<text:p>Hello</text:p><text:p>World</text:p>"),
        "spans": make_odt(d / "spans.odt",
                          '<text:p>Hel<text:span text:style-name="T1">lo</text:span></text:p><text:p>World</text:p>'),
        "dropped": make_odt(d / "dropped.odt",
                            '<text:p>a<text:s text:c="2"/>b<text:tab/>c<text:line-break/>d'
                            '<text:a xlink:href="https://x">link</text:a>e'
                            '<text:span>s1<text:span>nested</text:span>s2<text:s/>s3</text:span>f</text:p>'
                            '<text:h text:outline-level="1">Heading</text:h>'
                            '<table:table><table:table-row><table:table-cell><text:p>cell</text:p>'
                            '</table:table-cell></table:table-row></table:table>'
                            '<text:p>note<text:note><text:note-body><text:p>in note</text:p></text:note-body>'
                            '</text:note>end</text:p>'
                            '<text:p>x&amp;y &lt;z&gt;</text:p>'),
        "header": make_odt(d / "header.odt", "<text:p>Hello</text:p><text:p>World</text:p>",
                           master='<style:master-page style:name="Standard"><style:header>'
                                  '<text:p>Header text</text:p></style:header></style:master-page>'),
        "no_styles_in_manifest": make_odt(d / "no_styles_in_manifest.odt", "<text:p>Hello</text:p>",
                                          master='<style:master-page style:name="S"><style:header>'
                                                 '<text:p>H</text:p></style:header></style:master-page>',
                                          manifest_parts=("content.xml",)),
        "missing_styles": make_odt(d / "missing_styles.odt", "<text:p>Hello</text:p><text:p>World</text:p>",
                                   styles_in_zip=False),
        "case": make_odt(d / "case.odt", "<text:p>HELLO</text:p><text:p>world</text:p>"),
        "empty": make_odt(d / "empty.odt", ""),
    }
