"""Stable text cleaning: the same bytes always give the same text.

Every extracted document passes through `normalise_text`; format-specific markup (troff in
manual pages, GCIDE's source tags) is removed by the helpers below before that.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TRAILING_WS = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")


def normalise_text(text: str) -> str:
    """NFC, Unix newlines, tabs -> spaces, no control characters, no trailing blanks,
    at most one empty line in a row, no leading/trailing blank lines."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text.expandtabs(4))
    text = _TRAILING_WS.sub("\n", text + "\n")
    return _BLANK_RUNS.sub("\n\n", text).strip("\n")


def whitespace_key(text: str) -> str:
    """The text with all whitespace runs collapsed to one space (for near-duplicate checks)."""
    return " ".join(text.split())


def content_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def normalised_sha256(text: str) -> str:
    return content_sha256(whitespace_key(text))


def truncate_at_line(text: str, max_chars: int) -> str:
    """At most `max_chars` characters, cut at the last line break before the limit if any."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    return text[: cut if cut > max_chars // 2 else max_chars].rstrip()


# ---- manual pages (troff) ---------------------------------------------------------------------

_TROFF_ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),    # font changes \fB \fI \fP \f(CW \f[B]
    (re.compile(r"\\s[+-]?\d+"), ""),               # size changes
    (re.compile(r"\\[,/&:%]"), ""),                 # italic corrections, zero-width breaks
    (re.compile(r"\\\*\((..)"), ""),                # string registers \*(lq
    (re.compile(r"\\\*\[[^\]]*\]"), ""),
    (re.compile(r"\\\*."), ""),
    (re.compile(r"\\n(\(..|\[[^\]]*\]|.)"), ""),     # number registers
]
_TROFF_CHARS = {
    r"\-": "-", r"\(em": "—", r"\(en": "–", r"\(hy": "-", r"\(bu": "•", r"\(lq": "“", r"\(rq": "”",
    r"\(aq": "'", r"\(dq": '"', r"\(co": "©", r"\(rg": "®", r"\(tm": "™", r"\(mu": "×",
    r"\(Fo": "«", r"\(Fc": "»", r"\(fo": "‹", r"\(fc": "›", r"\(oq": "‘", r"\(cq": "’",
    r"\(ti": "~", r"\(ha": "^", r"\(rs": "\\", r"\(ga": "`", r"\(de": "°", r"\(+-": "±",
    r"\[em]": "—", r"\[en]": "–", r"\[lq]": "“", r"\[rq]": "”", r"\[aq]": "'", r"\[dq]": '"',
    r"\e": "\\", r"\ ": " ", r"\~": " ", r"\0": " ", r"\|": "", r"\^": "", r"\.": ".", r"\'": "'",
    r"\`": "`",
}
_TROFF_CHAR_RE = re.compile("|".join(re.escape(k) for k in sorted(_TROFF_CHARS, key=len, reverse=True)))
_TROFF_LEFTOVER = re.compile(r"\\\(..|\\\[[^\]]*\]")
_HEADINGS = {"SH", "SS"}
_DROP_REQUESTS = {"TH", "PP", "P", "LP", "TP", "IP", "HP", "RS", "RE", "br", "sp", "nf", "fi", "ad",
                  "na", "ne", "in", "ti", "ft", "ps", "ll", "hy", "nh", "ds", "de", "ie", "if", "el",
                  "so", "TQ", "UR", "UE", "MT", "ME", "EX", "EE", "ig", "nr", "rr", "tr", "cs", "ss",
                  "bp", "pc", "ta", "mso", "rm", "als", "ev", "PD", "DT", "YS", "SY", "OP", "ce", "ul",
                  "lf", "it", "ns", "rs", "..", "fam", "Vb", "Ve", "Sp", "AT", "UC"}
_FONT_REQUESTS = {"B", "I", "R", "BI", "BR", "IB", "IR", "RB", "RI", "SM", "SB"}


def _unescape_troff(line: str) -> str:
    line = _TROFF_CHAR_RE.sub(lambda m: _TROFF_CHARS[m.group(0)], line)
    for pattern, repl in _TROFF_ESCAPES:
        line = pattern.sub(repl, line)
    return _TROFF_LEFTOVER.sub("", line)


def _font_request_text(args: str) -> str:
    # .BR ls (1) -> "ls(1)": alternating fonts join their arguments without spaces
    parts = re.findall(r'"[^"]*"|\S+', args)
    return "".join(p.strip('"') for p in parts)


def troff_to_text(src: str) -> str:
    """A manual page's troff source -> plain text (headings, paragraphs, option lists).

    Not a full troff: requests are dropped, font requests keep their words, escapes become the
    characters they name. Deterministic and independent of the installed groff.
    """
    out: list[str] = []
    skipping = False  # inside .ig / .de blocks
    for raw in src.split("\n"):
        if skipping:
            skipping = not raw.startswith("..")
            continue
        if raw.startswith(('.\\"', "'\\\"", '\\"', ".\\\"")):
            continue
        if raw.startswith((".", "'")):
            request, _, args = raw[1:].strip().partition(" ")
            if request in ("ig", "de", "de1", "am"):
                skipping = True
                continue
            if request in _HEADINGS:
                out += ["", _unescape_troff(args.strip().strip('"')), ""]
            elif request in _FONT_REQUESTS:
                text = args if request in ("B", "I", "SM", "SB") else _font_request_text(args)
                out.append(_unescape_troff(text.strip().strip('"') if request in ("B", "I") else text))
            elif request in ("PP", "P", "LP", "TP", "IP", "HP", "sp"):
                if request == "IP" and args.strip():
                    out += ["", _unescape_troff(args.split('"')[1] if '"' in args else args.split()[0])]
                else:
                    out.append("")
            # every other request is layout only: dropped
            continue
        out.append(_unescape_troff(raw))
    return normalise_text("\n".join(out))


# ---- GCIDE / dictd ----------------------------------------------------------------------------

_GCIDE_TAGS = re.compile(r"^\s*\[(?:[^\]\n]*(?:Webster|WordNet|PJC|Century|Suppl\.)[^\]\n]*)\]\s*\S*\s*$",
                         re.MULTILINE)
_GCIDE_PRONUNCIATION = re.compile(r"\\[^\\\n]{1,80}\\")
_GCIDE_RESPELLING = re.compile(r" ?\((?=[^()\n]*\[[^\]\n]{1,4}\])[^()\n]*\)")   # ([a^]n"thr[a^]ks)
_SPACE_BEFORE_COMMA = re.compile(r" +,")


def clean_gcide(entry: str) -> str:
    """Drop GCIDE's per-sense source tags ("[1913 Webster]"), pronunciation keys
    (\\A*bash"\\) and respellings (([a^]n"thr[a^]ks)): editorial markup, not text."""
    entry = _GCIDE_TAGS.sub("", entry)
    entry = _GCIDE_RESPELLING.sub("", _GCIDE_PRONUNCIATION.sub("", entry))
    return _SPACE_BEFORE_COMMA.sub(",", entry)


_QUOTE_AUTHOR = re.compile(r"--\s?[A-Z]")
_SPACE_BEFORE_AUTHOR = re.compile(r"\s{2,}--")


def gcide_quotations(entry: str) -> list[str]:
    """The literary quotations cited in a GCIDE entry ("Satan stood / Awhile as mute ...
    --Milton."): blocks of lines indented 8+ spaces whose last line names an author.
    Usage notes and synonym lists (also deeply indented) are not quotations."""
    blocks: list[list[str]] = []
    cur: list[str] = []
    for line in entry.split("\n") + [""]:
        indent = len(line) - len(line.lstrip(" "))
        if line.strip() and indent >= 8 and not line.strip().startswith("["):
            cur.append(line.strip())
            continue
        if cur and _QUOTE_AUTHOR.search(cur[-1]) and not cur[0].startswith(("Note", "Syn")):
            blocks.append(cur)
        cur = []
    return [_SPACE_BEFORE_AUTHOR.sub(" --", "\n".join(b)) for b in blocks]
