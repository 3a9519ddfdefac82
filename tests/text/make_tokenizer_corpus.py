#!/usr/bin/python3
"""Writes a seeded corpus of test strings for one Hugging Face tokenizer.json.

The differential tokenizer tests encode every string with chunkattn's C++
tokenizer and with Hugging Face's JavaScript tokenizers
(tests/text/hf_reference/encode.mjs) and compare the ids line by line. This
script makes those strings: the hard cases of byte-level and SentencePiece-style
BPE (scripts, emoji sequences, combining marks in composed and decomposed form,
Unicode spaces, digit runs, code, punctuation, contractions, the tokenizer's own
added tokens and near misses of them) and a few megabytes of real prose, from
the public-domain plays in data/demo.

Output: JSON Lines, one {"text": "...", "kind": "..."} a line, UTF-8 (no ASCII
escaping). "kind" names the generator (prose, code, multilingual, ...), so a
benchmark can report throughput per kind. Every text is valid Unicode (no lone
surrogates) and holds only characters assigned in this Python's Unicode
database (14.0 on Debian 12), so that a difference in Unicode versions between
the two sides never shows up as a tokenizer bug.

Deterministic: the same --seed, --count, tokenizer.json and prose files give
the same bytes. Standard library only; run it with /usr/bin/python3.

Usage:
  make_tokenizer_corpus.py --tokenizer-json PATH [--seed N] [--count N]
                           [--prose-mb MB] [--prose FILE]... [--out FILE]
"""

import argparse
import json
import random
import string
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROSE = [REPO / "data" / "demo" / "shakespeare.txt",
                 REPO / "data" / "demo" / "prompts.txt",
                 REPO / "data" / "demo" / "system_prompt.txt"]

# Share of the strings (after the fixed edge cases and the long prose passages)
# that each generator makes; "fuzz" takes what rounding leaves.
WEIGHTS = {
    "prose": 0.30,
    "prose_variant": 0.03,
    "multilingual": 0.10,
    "emoji": 0.04,
    "normalization": 0.05,
    "whitespace": 0.06,
    "digits": 0.04,
    "code": 0.08,
    "punctuation": 0.03,
    "contractions": 0.03,
    "mixed_case": 0.02,
    "special_tokens": 0.05,
    "near_miss": 0.03,
    "random_unicode": 0.03,
}

# ---------------------------------------------------------------------------
# Building blocks. Written here for this corpus (short everyday phrases).

PHRASES = {
    "chinese": [
        "今天天气很好，我们去公园散步吧。", "机器学习是人工智能的一个分支。",
        "请把这本书放在桌子上。", "我喜欢喝绿茶，不喜欢喝咖啡。",
        "北京是中国的首都。", "這是一個繁體中文的句子。", "他说：“明天见！”",
        "中文没有空格分词", "第一章　总则",
    ],
    "japanese": [
        "こんにちは、世界！今日はいい天気ですね。", "カタカナとひらがなを混ぜた文章です。",
        "東京駅から新幹線に乗りました。", "ｶﾀｶﾅの半角文字もあります。",
        "ラーメンが食べたい。", "「はい」と彼は言った。", "日本語の文章には空白がない",
        "ガギグゲゴ パピプペポ", "ヴァイオリン",
    ],
    "korean": [
        "안녕하세요, 만나서 반갑습니다.", "한국어 문장을 토큰화합니다.",
        "서울은 대한민국의 수도입니다.", "오늘 저녁에 뭐 먹을까요?", "ㄱㄴㄷㄹ ㅏㅑㅓㅕ",
    ],
    "arabic": [
        "مرحبا بالعالم", "اللغة العربية جميلة جدا.", "مَرْحَبًا بِكُمْ",
        "كتب الطالب الدرس في الدفتر.", "السلام عليكم ورحمة الله", "العدد ١٢٣٤٥ مكتوب بالأرقام العربية",
    ],
    "hebrew": [
        "שלום עולם", "שָׁלוֹם", "אני אוהב לקרוא ספרים.", "עברית נכתבת מימין לשמאל",
        "בְּרֵאשִׁית",
    ],
    "devanagari": [
        "नमस्ते दुनिया", "हिन्दी भाषा बहुत सुंदर है।", "मैं आज बाज़ार जा रहा हूँ।",
        "संस्कृतम्", "क़लम और ज़मीन", "१२३४५ अंक",
    ],
    "thai": [
        "สวัสดีครับ", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ", "กรุงเทพมหานคร",
        "ขอบคุณมากค่ะ", "๑๒๓๔๕",
    ],
    "cyrillic": [
        "Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Москва — столица России.", "Ёлка и ёж", "Україна, Київ, їжак", "Беларусь: ў",
        "ПРОПИСНЫЕ БУКВЫ",
    ],
    "greek": [
        "Γειά σου Κόσμε", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "ΣΟΦΟΣ σοφός",
        "Αθήνα, Ελλάδα", "ἐν ἀρχῇ ἦν ὁ λόγος", "Ωμέγα ω",
    ],
    "latin": [
        "café naïve résumé", "Größe Straße GROẞE", "Zażółć gęślą jaźń",
        "İstanbul ılık", "Ærøskøbing Ångström", "Tiếng Việt có nhiều dấu thanh.",
        "ŒUVRE cœur", "Ĳsselmeer", "señor niño año", "Dvořák Škoda", "ſtraſſe",
    ],
}

# Emoji: plain, with skin tones, ZWJ sequences, flags, keycaps and tag sequences.
EMOJI_BASE = ["\U0001F600", "\U0001F602", "\U0001F970", "\U0001F44D", "\U0001F525",
              "\U0001F680", "\U0001F4A9", "\U0001F916", "\U0001F431", "\U0001F355",
              "\u2764\ufe0f", "\u2728", "\u2705", "\u26a1", "\u263a\ufe0e", "\u263a\ufe0f",
              "\U0001F972", "\U0001FAE0", "\U0001F9D1", "\U0001F44B", "\U0001F64F"]
EMOJI_TONABLE = ["\U0001F44D", "\U0001F44B", "\U0001F64F", "\U0001F9D1", "\U0001F469",
                 "\U0001F468", "\U0001F476", "\U0001F44C", "\u270c\ufe0f", "\U0001F590"]
SKIN_TONES = ["\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
ZWJ = "\u200d"
EMOJI_ZWJ = [
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",  # family
    "\U0001F469\u200d\U0001F4BB",  # woman technologist
    "\U0001F9D1\U0001F3FD\u200d\U0001F680",  # astronaut, medium skin tone
    "\U0001F3F3\ufe0f\u200d\U0001F308",  # rainbow flag
    "\U0001F3F4\u200d\u2620\ufe0f",  # pirate flag
    "\U0001F441\ufe0f\u200d\U0001F5E8\ufe0f",  # eye in speech bubble
    "\u2764\ufe0f\u200d\U0001F525",  # heart on fire
    "\U0001F469\U0001F3FE\u200d\u2764\ufe0f\u200d\U0001F48B\u200d\U0001F468\U0001F3FB",
    "\U0001F415\u200d\U0001F9BA",  # service dog
    "\U0001F9D4\u200d\u2642\ufe0f",
]
FLAGS = ["US", "JP", "DE", "FR", "BR", "IN", "KR", "UA", "GB", "CN", "ZA", "EU"]
KEYCAPS = [c + "\ufe0f\u20e3" for c in "0123456789#*"]
# England and Scotland: a black flag, tag letters, then CANCEL TAG.
TAG_FLAGS = ["\U0001F3F4" + "".join(chr(0xE0000 + ord(c)) for c in sub) + "\U000E007F"
             for sub in ("gbeng", "gbsct")]


def flag(code):
    return "".join(chr(0x1F1E6 + ord(c) - ord("A")) for c in code)


# Characters whose NFC or NFKC form differs from themselves, or that compose.
NORMALIZATION_SAMPLES = [
    "\u212b", "\u2126", "\u212a", "\u037e", "\u0387", "\u1f71", "\u2000", "\u2329",
    "\uf900", "\uf9d1", "\u0958", "\u095c", "\ufb1d", "\u2adc", "\u0f73", "\u0340",
    "\u0341", "\u0374", "\ufb01", "\ufb02", "\ufb03", "\uff21\uff22\uff23",
    "\uff46\uff55\uff4c\uff4c", "\u3231", "\u338f", "\u2460", "\u00bd", "\u00b2",
    "\u2122", "\uff76\uff9e", "\uff8a\uff9f", "\u01c5", "\u210c", "\U0001d400",
    "\u2075", "\u2085", "\u00a0", "\u2002", "\u3000", "\u1100\u1161\u11a8",
    "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u0041\u030a", "\u0065\u0301",
    "\u0061\u0323\u0307", "\u0061\u0307\u0323", "\u0071\u0307\u0323",
    "\u05e9\u05bc\u05c1", "\u05e9\u05c1\u05bc", "\u0915\u093c", "\u0e40\u0e01",
    "\u1e9b\u0323", "\u017f", "\u0132", "\u00c5", "\u1e0b\u0323", "\u0064\u0323\u0307",
]
COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + ["\u20dd", "\u20e3", "\u0489"]
ACCENTED_WORDS = ["café", "naïve", "résumé", "Ångström", "Zürich", "piñata", "façade",
                  "crème brûlée", "Dvořák", "Łódź", "Tiếng Việt", "Ελληνικά", "ῥῆμα",
                  "Άγιος", "Москва́", "보기", "デジタル", "ｶﾞｷﾞ", "niño", "über"]

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\u00a0",
              "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005",
              "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u202f", "\u205f",
              "\u3000", "\u0085", "\u2028", "\u2029", "\u000b", "\u000c", "\u200b",
              "\ufeff", "\u180e", "\u001c", "\u001f", "\u2060"]

UNICODE_PUNCT = ["“", "”", "‘", "’", "…", "—", "–", "«", "»", "¿", "¡", "、", "。",
                 "「", "」", "『", "』", "【", "】", "・", "‼", "⁇", "※", "§", "¶",
                 "†", "‡", "•", "′", "″", "‹", "›", "„", "‚", "·", "،", "؛", "؟",
                 "।", "॥", "׃", "״", "¦", "©", "®", "°", "±", "×", "÷", "€", "£",
                 "¥", "₹", "₩", "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "♥", "★",
                 "✓", "❤", "〜", "～", "！", "？", "，", "．", "：", "；", "（", "）"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
CONTRACTION_WORDS = ["it", "don", "we", "they", "I", "you", "he", "she", "that",
                     "what", "John", "can", "won", "there", "who", "y", "o"]

DIGIT_SETS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯",
              "๐๑๒๓๔๕๖๗๘๙", "０１２３４５６７８９", "⁰¹²³⁴⁵⁶⁷⁸⁹", "₀₁₂₃₄₅₆₇₈₉",
              "①②③④⑤⑥⑦⑧⑨", "ⅠⅡⅢⅣⅤⅥⅦⅧⅨ", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗"]

WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with",
         "was", "on", "be", "at", "by", "this", "have", "from", "or", "one", "had",
         "word", "but", "not", "what", "all", "were", "when", "your", "can", "said",
         "there", "use", "each", "which", "their", "time", "will", "way", "about",
         "many", "then", "them", "would", "write", "like", "so", "these", "her",
         "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day",
         "could", "go", "come", "did", "number", "sound", "most", "people", "over",
         "know", "water", "than", "call", "first", "who", "may", "down", "side",
         "been", "now", "find", "any", "new", "work", "part", "take", "get", "place",
         "made", "live", "where", "after", "back", "little", "only", "round", "man",
         "year", "came", "show", "every", "good", "me", "give", "our", "under",
         "tokenizer", "attention", "prefix", "cache", "chunk", "kernel", "server"]

IDENT_WORDS = ["count", "value", "index", "buffer", "token", "cache", "chunk", "request",
               "size", "offset", "data", "result", "node", "tree", "prefix", "key", "item",
               "list", "map", "config", "server", "worker", "stream", "batch", "length",
               "head", "dim", "seq", "block", "page", "pool", "alloc", "free", "handle",
               "state", "status", "error", "message", "path", "file", "name", "id", "num",
               "max", "min", "total", "input", "output", "query", "score", "weight"]


# ---------------------------------------------------------------------------

class Corpus:
    """Generators for each kind of string; all randomness comes from self.rng."""

    def __init__(self, rng, tokenizer, prose_texts):
        self.rng = rng
        self.added = [t["content"] for t in tokenizer.get("added_tokens", [])]
        self.special = [t["content"] for t in tokenizer.get("added_tokens", [])
                        if t.get("special")]
        self.template_tokens = sorted(template_special_tokens(tokenizer.get("post_processor")))
        self.lines = []
        self.paragraphs = []
        for text in prose_texts:
            text = text.replace("\r\n", "\n")
            self.lines += [line for line in text.split("\n") if line.strip()]
            self.paragraphs += [p.strip("\n") for p in text.split("\n\n") if p.strip()]
        self.prose_texts = prose_texts
        self.unit = "    "  # code indentation, chosen per snippet
        # Opening and closing tokens of chat turns, such as <|im_start|> and <|im_end|>.
        added = set(self.added)
        self.turn_pairs = [(a, a.replace(old, new)) for a in self.added
                           for old, new in (("start", "end"), ("begin", "end"))
                           if old in a and a.replace(old, new) in added]

    # -- helpers ------------------------------------------------------------
    def pick(self, seq):
        return self.rng.choice(seq)

    def words(self, lo, hi):
        return " ".join(self.pick(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def chars_from(self, ranges, n):
        out = []
        while len(out) < n:
            lo, hi = self.pick(ranges)
            ch = chr(self.rng.randint(lo, hi))
            if unicodedata.category(ch) not in ("Cn", "Cs", "Co"):
                out.append(ch)
        return "".join(out)

    def sentence(self):
        s = self.words(3, 12)
        return s[:1].upper() + s[1:] + self.pick([".", "!", "?", ",", ";", ":", "..."])

    def prose_line(self):
        i = self.rng.randrange(len(self.lines))
        return "\n".join(self.lines[i:i + self.rng.randint(1, 3)])

    def ident(self):
        parts = [self.pick(IDENT_WORDS) for _ in range(self.rng.randint(1, 3))]
        style = self.rng.randrange(7)
        if style == 0:
            s = "_".join(parts)
        elif style == 1:
            s = parts[0] + "".join(p.capitalize() for p in parts[1:])
        elif style == 2:
            s = "".join(p.capitalize() for p in parts)
        elif style == 3:
            s = "_".join(parts).upper()
        elif style == 4:
            s = "k" + "".join(p.capitalize() for p in parts)
        elif style == 5:
            s = "_".join(parts) + "_"
        else:
            s = "_".join(parts) + str(self.rng.randint(0, 99))
        return s

    def number(self):
        r = self.rng.randrange(10)
        if r < 4:
            return str(self.rng.randint(0, 10 ** self.rng.randint(1, 12)))
        if r < 6:
            return f"{self.rng.uniform(-1000, 1000):.{self.rng.randint(1, 6)}f}"
        if r < 7:
            return f"{self.rng.uniform(0, 1):.3e}"
        if r < 8:
            return hex(self.rng.randint(0, 2 ** 32))
        if r < 9:
            return f"{self.rng.randint(0, 10 ** 9):,}"
        return "".join(self.pick("0123456789") for _ in range(self.rng.randint(4, 40)))

    # -- generators, one per kind ----------------------------------------------
    def prose(self):
        if self.rng.random() < 0.6:
            return self.prose_line()
        i = self.rng.randrange(len(self.paragraphs))
        return "\n\n".join(self.paragraphs[i:i + self.rng.randint(1, 4)])

    def prose_long(self):
        i = self.rng.randrange(len(self.paragraphs))
        out, size, target = [], 0, self.rng.randint(2_000, 60_000)
        while size < target:
            p = self.paragraphs[i % len(self.paragraphs)]
            out.append(p)
            size += len(p) + 2
            i += 1
        return "\n\n".join(out) + self.pick(["", "\n", "\n\n"])

    def prose_variant(self):
        text = self.prose()
        r = self.rng.randrange(9)
        if r == 0:
            return text.replace("\n", "\r\n")
        if r == 1:
            return text.upper()
        if r == 2:
            return text.lower()
        if r == 3:
            return "\n".join("\t" + line for line in text.split("\n"))
        if r == 4:
            return text.replace(". ", ".  ").replace(" ", self.pick([" ", "  ", "\u00a0"]))
        if r == 5:
            return "“" + text.replace("'", "’") + "”"
        if r == 6:
            return "    " + text + "   \n"
        if r == 7:
            return " ".join(text.split())
        return text.replace(" ", "")

    def multilingual(self):
        r = self.rng.randrange(6)
        if r <= 1:
            return self.pick(self.pick(list(PHRASES.values())))
        if r == 2:  # several languages in one string
            langs = list(PHRASES.values())
            return self.pick([" ", "", "\n", " | "]).join(
                self.pick(self.pick(langs)) for _ in range(self.rng.randint(2, 5)))
        if r == 3:  # mixed with English
            return f"{self.sentence()} {self.pick(self.pick(list(PHRASES.values())))} {self.words(1, 5)}"
        if r == 4:  # random runs from one script
            return self.random_script_text()
        return self.pick(self.pick(list(PHRASES.values()))) * self.rng.randint(2, 6)

    def random_script_text(self):
        scripts = [
            [(0x4E00, 0x9FFF)], [(0x3041, 0x3096), (0x30A1, 0x30FA)], [(0xFF66, 0xFF9D)],
            [(0xAC00, 0xD7A3)], [(0x0621, 0x064A), (0x064B, 0x0652)],
            [(0x05D0, 0x05EA), (0x05B0, 0x05BC)],
            [(0x0905, 0x0939), (0x093E, 0x094D)], [(0x0E01, 0x0E2E), (0x0E31, 0x0E3A), (0x0E40, 0x0E4E)],
            [(0x0410, 0x044F)], [(0x0391, 0x03A9), (0x03B1, 0x03C9)],
            [(0x20000, 0x2A6DF)], [(0x1100, 0x1112), (0x1161, 0x1175), (0x11A8, 0x11C2)],
        ]
        ranges = self.pick(scripts)
        words = [self.chars_from(ranges, self.rng.randint(1, 12)) for _ in range(self.rng.randint(1, 8))]
        return self.pick([" ", "", "、", ", ", "\n"]).join(words)

    def emoji(self):
        def one():
            r = self.rng.randrange(6)
            if r == 0:
                return self.pick(EMOJI_BASE)
            if r == 1:
                return self.pick(EMOJI_TONABLE) + self.pick(SKIN_TONES)
            if r == 2:
                return self.pick(EMOJI_ZWJ)
            if r == 3:
                return flag(self.pick(FLAGS))
            if r == 4:
                return self.pick(KEYCAPS)
            return self.pick(TAG_FLAGS + [self.pick(SKIN_TONES), ZWJ, "\ufe0f",
                                          chr(0x1F1E6 + self.rng.randrange(26))])
        r = self.rng.randrange(4)
        if r == 0:
            return "".join(one() for _ in range(self.rng.randint(1, 12)))
        if r == 1:
            return " ".join(one() for _ in range(self.rng.randint(1, 8)))
        if r == 2:
            return f"{self.sentence()}{self.pick(['', ' '])}{one()}{self.pick(['', ' ', '!'])}{self.words(0, 4)}"
        return self.pick(WORDS) + one() + self.pick(WORDS)

    def normalization(self):
        r = self.rng.randrange(7)
        if r == 0:
            w = self.pick(ACCENTED_WORDS)
            return " ".join([w, unicodedata.normalize("NFD", w), unicodedata.normalize("NFKD", w)])
        if r == 1:
            w = self.pick(ACCENTED_WORDS + [self.sentence()])
            return unicodedata.normalize(self.pick(["NFC", "NFD", "NFKC", "NFKD"]), w)
        if r == 2:
            return self.pick(WORDS) + "".join(self.pick(NORMALIZATION_SAMPLES)
                                              for _ in range(self.rng.randint(1, 5))) + self.pick(WORDS)
        if r == 3:  # stacked marks, also after a space, a digit, an emoji, or at the start
            base = self.pick(["a", "e", "Z", " ", "1", "\U0001F600", "", "ß", "中", "\n"])
            return base + "".join(self.pick(COMBINING) for _ in range(self.rng.randint(1, 12))) + self.pick(["", " x", "y"])
        if r == 4:
            return self.pick(NORMALIZATION_SAMPLES)
        if r == 5:  # precomposed and decomposed Hangul side by side
            s = self.chars_from([(0xAC00, 0xD7A3)], self.rng.randint(1, 6))
            return s + " " + unicodedata.normalize("NFD", s)
        w = self.sentence() + " " + self.pick(ACCENTED_WORDS)
        return "".join(c + self.pick(COMBINING) if self.rng.random() < 0.2 else c for c in w)

    def whitespace(self):
        ws = lambda: "".join(self.pick(WHITESPACE) for _ in range(self.rng.randint(1, 4)))
        r = self.rng.randrange(8)
        if r == 0:
            return ws()
        if r == 1:
            return ws() + self.words(1, 5)
        if r == 2:
            return self.words(1, 5) + ws()
        if r == 3:
            return ws().join(self.words(1, 1) for _ in range(self.rng.randint(2, 8)))
        if r == 4:
            return self.pick([" ", "\t", "\n", "\u00a0", "\u3000", "\r\n"]) * self.rng.randint(2, 80)
        if r == 5:
            return self.words(1, 3) + " " * self.rng.randint(1, 40) + "\n" + " " * self.rng.randint(0, 40) + self.words(1, 3)
        if r == 6:
            return "\n".join(" " * self.rng.randint(0, 12) + self.words(0, 4) + " " * self.rng.randint(0, 3)
                             for _ in range(self.rng.randint(2, 8)))
        return ws() + self.sentence() + ws() + self.sentence() + ws()

    def digits(self):
        r = self.rng.randrange(9)
        if r == 0:
            return "".join(self.pick("0123456789") for _ in range(self.rng.randint(1, 300)))
        if r == 1:
            return self.number()
        if r == 2:
            ds = self.pick(DIGIT_SETS)
            return "".join(self.pick(ds) for _ in range(self.rng.randint(1, 20)))
        if r == 3:
            return f"{self.rng.randint(1900, 2100)}-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}T{self.rng.randint(0, 23):02d}:{self.rng.randint(0, 59):02d}:{self.rng.randint(0, 59):02d}Z"
        if r == 4:
            return ".".join(str(self.rng.randint(0, 255)) for _ in range(4)) + f":{self.rng.randint(1, 65535)}"
        if r == 5:
            return self.pick(WORDS) + self.number() + self.pick(WORDS)
        if r == 6:
            return f"+1 ({self.rng.randint(200, 999)}) {self.rng.randint(200, 999)}-{self.rng.randint(0, 9999):04d}"
        if r == 7:
            return f"v{self.rng.randint(0, 20)}.{self.rng.randint(0, 99)}.{self.rng.randint(0, 999)} costs ${self.rng.randint(0, 10000)}.{self.rng.randint(0, 99):02d} or {self.rng.randint(1, 100)}%"
        return " ".join(self.number() for _ in range(self.rng.randint(2, 10)))

    def code(self):
        gen = self.pick([self.code_python, self.code_python, self.code_cpp, self.code_cpp,
                         self.code_json, self.code_js, self.code_shell, self.code_sql,
                         self.code_html, self.code_markdown, self.code_yaml, self.code_rust])
        text = gen()
        r = self.rng.random()
        if r < 0.05:
            text = text.replace("\n", "\r\n")
        elif r < 0.1:
            text = "\n".join(line + " " * self.rng.randint(0, 3) for line in text.split("\n"))
        return text

    def indent_unit(self):
        return self.pick(["    ", "    ", "  ", "\t", "        "])

    def py_expr(self, depth=0):
        r = self.rng.randrange(10 if depth < 2 else 5)
        if r == 0:
            return self.ident()
        if r == 1:
            return self.number()
        if r == 2:
            return repr(self.words(1, 4) + self.pick(["", "\n", "\t", "'", '"', "\\"]))
        if r == 3:
            return f"{self.ident()}[{self.rng.randint(0, 9)}]"
        if r == 4:
            return f"{self.ident()}.{self.ident()}"
        if r == 5:
            return f"{self.py_expr(depth + 1)} {self.pick(['+', '-', '*', '//', '%', '**', '==', '!=', '<=', 'and', 'or', '<<', '&', '|'])} {self.py_expr(depth + 1)}"
        if r == 6:
            return f"{self.ident()}({', '.join(self.py_expr(depth + 1) for _ in range(self.rng.randint(0, 3)))})"
        if r == 7:
            return f"[{self.ident()} for {self.ident()} in range({self.number()})]"
        if r == 8:
            return f'f"{{{self.ident()}!r}}: {{{self.ident()}:>{self.rng.randint(1, 9)}}}"'
        return "{" + ", ".join(f"'{self.ident()}': {self.py_expr(depth + 1)}" for _ in range(self.rng.randint(0, 3))) + "}"

    def py_block(self, ind, depth):
        lines = []
        for _ in range(self.rng.randint(1, 5)):
            r = self.rng.randrange(8 if depth < 3 else 4)
            if r == 0:
                lines.append(f"{ind}{self.ident()} = {self.py_expr()}")
            elif r == 1:
                lines.append(f"{ind}return {self.py_expr()}")
            elif r == 2:
                lines.append(f"{ind}# {self.words(2, 8)}")
            elif r == 3:
                lines.append(f"{ind}{self.ident()} += {self.number()}")
            elif r == 4:
                lines.append(f"{ind}for {self.ident()} in {self.py_expr()}:")
                lines += self.py_block(ind + self.unit, depth + 1)
            elif r == 5:
                lines.append(f"{ind}if {self.py_expr()}:")
                lines += self.py_block(ind + self.unit, depth + 1)
                lines.append(f"{ind}else:")
                lines += self.py_block(ind + self.unit, depth + 1)
            elif r == 6:
                lines.append(f"{ind}try:")
                lines += self.py_block(ind + self.unit, depth + 1)
                lines.append(f"{ind}except {self.pick(['ValueError', 'KeyError', 'OSError'])} as e:")
                lines.append(f"{ind}{self.unit}raise RuntimeError(f\"{self.words(1, 3)}: {{e}}\") from e")
            else:
                lines.append(f"{ind}with open({self.py_expr()}, \"rb\") as f:")
                lines += self.py_block(ind + self.unit, depth + 1)
        return lines

    def code_python(self):
        self.unit = self.pick(["    ", "    ", "  ", "\t"])
        out = []
        if self.rng.random() < 0.3:
            out.append(f"import {self.ident()}\nfrom {self.ident()}.{self.ident()} import {self.ident()}\n")
        for _ in range(self.rng.randint(1, 3)):
            if self.rng.random() < 0.3:
                out.append(f"class {self.ident().capitalize()}({self.pick(['object', 'Exception', 'Base'])}):")
                out.append(f'{self.unit}"""{self.sentence()}"""')
                out.append(f"{self.unit}def __init__(self, {self.ident()}: int = {self.rng.randint(0, 9)}) -> None:")
                out += self.py_block(self.unit * 2, 1)
            else:
                args = ", ".join(f"{self.ident()}{self.pick(['', ': int', ': str', '=None', ': list[float]'])}"
                                 for _ in range(self.rng.randint(0, 4)))
                out.append(f"{self.pick(['', '@staticmethod' + chr(10), 'async '])}def {self.ident()}({args}):")
                out += self.py_block(self.unit, 1)
            out.append("")
        return "\n".join(out)

    def cpp_stmt(self, ind, depth):
        r = self.rng.randrange(9 if depth < 3 else 5)
        t = self.pick(["int", "auto", "size_t", "float", "std::string", "const char*",
                       "std::vector<int64_t>", "absl::StatusOr<int>", "uint8_t"])
        if r == 0:
            return [f"{ind}{t} {self.ident()} = {self.number()};"]
        if r == 1:
            return [f"{ind}{self.ident()}->{self.ident()}({self.ident()}, \"{self.words(1, 3)}\\n\");"]
        if r == 2:
            return [f"{ind}// {self.words(2, 9)}"]
        if r == 3:
            return [f"{ind}return {self.ident()} {self.pick(['<<', '>>', '&&', '||', '!=', '<=', '->*', '::'])} {self.ident()};"]
        if r == 4:
            return [f"{ind}std::cout << \"{self.sentence()}\" << std::endl;"]
        if r == 5:
            out = [f"{ind}for (int i = 0; i < {self.ident()}.size(); ++i) {{"]
            for _ in range(self.rng.randint(1, 3)):
                out += self.cpp_stmt(ind + self.unit, depth + 1)
            return out + [f"{ind}}}"]
        if r == 6:
            out = [f"{ind}if ({self.ident()} == nullptr || !{self.ident()}.ok()) {{"]
            out += self.cpp_stmt(ind + self.unit, depth + 1)
            return out + [f"{ind}}} else {{"] + self.cpp_stmt(ind + self.unit, depth + 1) + [f"{ind}}}"]
        if r == 7:
            return [f"{ind}auto {self.ident()} = [&]({t} x) -> bool {{ return x > {self.number()}; }};"]
        return [f"{ind}/* {self.words(3, 10)} */", f"{ind}{self.ident()}[{self.rng.randint(0, 64)}] = 0x{self.rng.randint(0, 255):02X}u;"]

    def code_cpp(self):
        self.unit = self.pick(["  ", "  ", "    ", "\t"])
        out = []
        if self.rng.random() < 0.5:
            out += [f"#include <{self.pick(['vector', 'string', 'memory', 'cstdint', 'absl/status/status.h'])}>",
                    f"#include \"{self.ident()}/{self.ident()}.h\"", ""]
        if self.rng.random() < 0.2:
            out.append(f"#define {self.ident().upper()}(x) ((x) * {self.rng.randint(2, 64)})")
        ns = self.ident()
        out.append(f"namespace {ns} {{")
        for _ in range(self.rng.randint(1, 3)):
            if self.rng.random() < 0.3:
                out.append(f"template <typename T, int kSize = {self.rng.randint(1, 256)}>")
            out.append(f"{self.pick(['void', 'int', 'absl::Status', 'std::string', 'bool'])} {self.ident()}::{self.ident()}(const T& {self.ident()}, int {self.ident()}) {{")
            for _ in range(self.rng.randint(1, 5)):
                out += self.cpp_stmt(self.unit, 1)
            out.append("}")
            out.append("")
        out.append(f"}}  // namespace {ns}")
        return "\n".join(out) + "\n"

    def json_value(self, depth):
        r = self.rng.randrange(8 if depth < 4 else 5)
        if r == 0:
            return self.rng.randint(-10 ** 6, 10 ** 6)
        if r == 1:
            return round(self.rng.uniform(-10, 10), self.rng.randint(0, 8))
        if r == 2:
            return self.pick([True, False, None])
        if r in (3, 4):
            return self.pick([self.words(1, 5), self.pick(self.pick(list(PHRASES.values()))),
                              self.pick(EMOJI_BASE), "line\nbreak\t\"quoted\"\\"])
        if r == 5:
            return [self.json_value(depth + 1) for _ in range(self.rng.randint(0, 5))]
        return {self.ident(): self.json_value(depth + 1) for _ in range(self.rng.randint(0, 5))}

    def code_json(self):
        value = {self.ident(): self.json_value(1) for _ in range(self.rng.randint(1, 6))}
        indent = self.pick([None, 2, 4, "\t"])
        return json.dumps(value, indent=indent, ensure_ascii=self.rng.random() < 0.3)

    def code_js(self):
        name = self.ident()
        return (f"export async function {name}({self.ident()}, {{ {self.ident()} = {self.number()} }} = {{}}) {{\n"
                f"  const {self.ident()} = await fetch(`/api/${{{self.ident()}}}?q=${{encodeURIComponent({self.ident()})}}`);\n"
                f"  if (!{self.ident()}?.ok) throw new Error(\"{self.sentence()}\");\n"
                f"  return {self.ident()}.map((x) => x.{self.ident()} ?? null).filter(Boolean);\n"
                f"}}\n")

    def code_shell(self):
        return (f"#!/usr/bin/env bash\nset -euo pipefail\n{self.ident().upper()}=${{{self.ident().upper()}:-$HOME/.cache}}\n"
                f"for f in \"${self.ident().upper()}\"/*.txt; do\n\tgrep -c '{self.pick(WORDS)}' \"$f\" | awk '{{s+=$1}} END {{print s}}' >> /tmp/{self.ident()}.log 2>&1\ndone\n")

    def code_sql(self):
        return (f"SELECT {self.ident()}, COUNT(*) AS n\nFROM {self.ident()}\n"
                f"WHERE {self.ident()} >= {self.number()} AND name LIKE '%{self.pick(WORDS)}%'\n"
                f"GROUP BY 1\nORDER BY n DESC\nLIMIT {self.rng.randint(1, 100)};")

    def code_html(self):
        return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{self.sentence()}</title></head>\n<body>\n"
                f"  <div class=\"{self.ident()}\" id=\"{self.ident()}\">\n    <p>{self.sentence()} &amp; {self.sentence()}</p>\n"
                f"    <a href=\"https://example.com/{self.ident()}?x=1&y=2\">{self.words(1, 3)}</a>\n  </div>\n"
                f"  <table><tr><td>{self.number()}</td><td><b>{self.words(1, 2)}</b></td></tr></table>\n</body>\n</html>\n")

    def code_markdown(self):
        return (f"# {self.sentence()}\n\n{self.sentence()} **{self.words(1, 3)}** and `{self.ident()}()`.\n\n"
                f"- [ ] {self.words(2, 5)}\n- [x] {self.words(2, 5)}\n\n```python\n{self.code_python()}```\n\n"
                f"| {self.ident()} | {self.ident()} |\n|---|---:|\n| {self.number()} | {self.number()} |\n")

    def code_yaml(self):
        return (f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {self.ident().replace('_', '-').lower()}\n"
                f"spec:\n  replicas: {self.rng.randint(1, 8)}\n  template:\n    spec:\n      containers:\n"
                f"        - name: {self.pick(WORDS)}\n          args: [\"--{self.ident()}={self.number()}\"]\n"
                f"          resources: {{limits: {{nvidia.com/gpu: {self.rng.randint(1, 8)}}}}}\n")

    def code_rust(self):
        return (f"impl<'a> {self.ident().capitalize()}<'a> {{\n    pub fn {self.ident()}(&mut self, {self.ident()}: &'a str) -> Result<usize, Box<dyn Error>> {{\n"
                f"        let {self.ident()}: Vec<_> = {self.ident()}.chars().filter(|c| !c.is_whitespace()).collect();\n"
                f"        println!(\"{{:?}} {{}}\", {self.ident()}, {self.number()});\n        Ok({self.ident()}.len())\n    }}\n}}\n")

    def punctuation(self):
        r = self.rng.randrange(6)
        if r == 0:
            return "".join(self.pick(string.punctuation) for _ in range(self.rng.randint(1, 30)))
        if r == 1:
            return "".join(self.pick(UNICODE_PUNCT) for _ in range(self.rng.randint(1, 15)))
        if r == 2:
            p = self.pick(string.punctuation + "".join(UNICODE_PUNCT))
            return p * self.rng.randint(2, 40)
        if r == 3:
            return self.pick(WORDS) + self.pick(["!!!", "?!", "...", "…", "--", "::", "->", "=>", ".,", "'\"", "),"]) + self.pick(["", " ", "\n"]) + self.pick(WORDS)
        if r == 4:
            return "".join(self.pick([self.pick(WORDS), self.pick(string.punctuation), " "]) for _ in range(self.rng.randint(3, 20)))
        return f"({self.pick(WORDS)}) [{self.pick(WORDS)}] {{{self.pick(WORDS)}}} <{self.pick(WORDS)}> «{self.pick(WORDS)}» “{self.pick(WORDS)}” 「{self.pick(WORDS)}」"

    def contractions(self):
        def one():
            w = self.pick(CONTRACTION_WORDS)
            c = self.pick(CONTRACTIONS)
            case = self.rng.randrange(5)
            if case == 1:
                w, c = w.upper(), c.upper()
            elif case == 2:
                c = c.upper()
            elif case == 3:
                c = "".join(ch.upper() if self.rng.random() < 0.5 else ch for ch in c)
            elif case == 4:
                c = c.replace("'", self.pick(["’", "‘", "`", "''"]))
            return w + c
        r = self.rng.randrange(4)
        if r == 0:
            return " ".join(one() for _ in range(self.rng.randint(1, 8)))
        if r == 1:
            return self.pick(CONTRACTIONS + ["'S", "'LL", "'Re", "'tis", "'90s", "''s", "'", "rock'n'roll", "O'Neill's"])
        if r == 2:
            return "".join(one() for _ in range(self.rng.randint(2, 4)))
        return f"{self.sentence()} {one()} {self.words(1, 4)}{self.pick(CONTRACTIONS)}."

    def mixed_case(self):
        r = self.rng.randrange(4)
        w = self.words(1, 6)
        if r == 0:
            return "".join(c.upper() if self.rng.random() < 0.5 else c for c in w)
        if r == 1:
            return " ".join(self.ident() for _ in range(self.rng.randint(1, 6)))
        if r == 2:
            return self.pick(["iPhone", "McDonald", "ÉCOLE", "eBay", "PyTorch", "HTTPServer",
                              "XMLHttpRequest", "İi Iı", "ΣΑΣ σας", "ẞß", "ǅǆǄ", "ﬀ", "LaTeX", "NaN"]) + " " + w
        return w.title()

    def special_tokens(self):
        tokens = self.special_pool()
        if not tokens:
            return self.sentence()
        t = lambda: self.pick(tokens)
        r = self.rng.randrange(9)
        if r == 0:
            return t()
        if r == 1:
            return t() + self.sentence()
        if r == 2:
            return self.sentence() + t()
        if r == 3:
            return self.pick(WORDS) + t() + self.pick(WORDS)
        if r == 4:
            return f"{self.words(1, 4)} {t()} {self.words(1, 4)}"
        if r == 5:
            return "".join(t() for _ in range(self.rng.randint(2, 5)))
        if r == 6:
            return self.pick(WHITESPACE) + t() + self.pick(WHITESPACE) + t() + self.pick(WHITESPACE)
        if r == 7:
            return self.chat()
        return self.pick(list(PHRASES["chinese"]) + EMOJI_BASE) + t() + "\n" + self.prose_line() + t()

    def special_pool(self):
        # Every token the post-processor adds and every special token, then a
        # bounded sample of the rest (Gemma 3 has 6,415 added tokens).
        if not hasattr(self, "_pool"):
            rng = random.Random(1)  # independent of the corpus order
            others = [t for t in self.added if t not in self.special]
            specials = self.special if len(self.special) <= 64 else rng.sample(self.special, 64)
            self._pool = sorted(set(self.template_tokens + specials + rng.sample(others, min(64, len(others)))))
        return self._pool

    def chat(self):
        pairs = self.turn_pairs
        if not pairs:
            return " ".join(self.pick(self.special_pool()) + self.sentence() for _ in range(3))
        a, b = self.pick(pairs)
        turns = []
        for role in self.pick([["system", "user", "assistant"], ["user", "model"], ["user", "assistant", "user"]]):
            body = self.pick([self.sentence(), self.prose_line(), self.code_python(), self.multilingual()])
            turns.append(f"{a}{role}\n{body}{b}\n")
        return "".join(turns) + f"{a}{self.pick(['assistant', 'model'])}\n"

    def near_miss(self):
        tokens = self.special_pool()
        if not tokens:
            return self.sentence()
        tok = self.pick(tokens)
        r = self.rng.randrange(10)
        i = self.rng.randrange(len(tok))
        if r == 0:
            miss = tok[:i] + tok[i + 1:]  # <|im_star|>
        elif r == 1:
            miss = tok.swapcase() if tok.swapcase() != tok else tok + tok[-1]
        elif r == 2:
            miss = tok[:i] + " " + tok[i:]
        elif r == 3:
            miss = tok[:max(1, i)]  # a prefix only, often at the very end
        elif r == 4:
            miss = tok[0] + tok
        elif r == 5:
            miss = tok[:i] + self.pick([ZWJ, "\u200b", "\u0301"]) + tok[i:]
        elif r == 6:
            miss = tok.replace("|", "｜") if "|" in tok else tok.replace("｜", "|").replace("▁", " ")
        elif r == 7:
            miss = tok[:-1]
        elif r == 8:
            miss = tok[1:]
        else:
            miss = tok[:i] + self.pick(tokens) + tok[i:]  # a real token inside a broken one
        if miss == tok:
            miss = tok + "x"
        r = self.rng.randrange(6)
        return [miss, miss + " " + self.pick(WORDS), self.pick(WORDS) + miss, self.sentence() + " " + miss,
                miss + tok, tok + miss][r]

    def random_unicode(self):
        out = []
        n = self.rng.randint(1, 24)
        while len(out) < n:
            plane = self.rng.random()
            if plane < 0.7:
                cp = self.rng.randrange(0x20, 0x10000)
            elif plane < 0.95:
                cp = self.rng.randrange(0x10000, 0x20000)
            else:
                cp = self.rng.randrange(0x20000, 0x32000)
            ch = chr(cp)
            if unicodedata.category(ch) not in ("Cn", "Cs", "Co"):
                out.append(ch)
        return "".join(out)

    def fuzz(self):
        gens = [self.prose_line, self.sentence, self.multilingual, self.emoji, self.normalization,
                self.whitespace, self.digits, self.punctuation, self.contractions, self.mixed_case,
                self.special_tokens, self.near_miss, self.random_unicode]
        return self.pick(["", " ", "\n"]).join(self.pick(gens)() for _ in range(self.rng.randint(2, 8)))

    # -- fixed cases ------------------------------------------------------------
    def edge_cases(self):
        cases = ["", " ", "  ", "\n", "\t", "\r\n", "\r", "a", "A", "é", "e\u0301", "\u0301", "0", "00",
                 "000", "0000", "<", ">", "|", "'", "'s", "''", "▁", "▁▁", " ▁", "Ġ", "ĠĠ", "Ċ",
                 "<0x41>", "<0x0A>", "<unk>", "[UNK]", "\x00", "\x01", "\x7f", "\x1b[31m", "\ufffd",
                 "\U0010FFFD", "\ud7fb", "\ue000", "\u00ad", "\u200d", "\ufe0f", "\U0001F600",
                 "hello", " hello", "hello ", " hello ", "Hello World", "Hello, world!", "\nhello\n",
                 "a\u00a0b", "a\u3000b", "a\u2028b", "a\u0085b", "x" * 1000, " " * 1000, "\n" * 200,
                 "\t" * 100, "ab" * 500, "1" * 1000, "\U0001F600" * 200, "日本" * 300, "é" * 300,
                 "e\u0301" * 300, "a " * 500, "The quick brown fox jumps over the lazy dog.",
                 "THE QUICK BROWN FOX", "I'm", "I'M", "don't", "DON'T", "we'll", "you've", "they're",
                 "it'd", "123,456.789", "3.14159265358979323846264338327950288419716939937510"]
        cases += self.added[:8] + self.template_tokens
        for tok in self.special_pool()[:8]:
            cases += [tok + tok, " " + tok, tok + " ", "\n" + tok + "\n", "x" + tok + "y"]
        return cases


def template_special_tokens(post_processor):
    """Token strings a TemplateProcessing post-processor may add, at any depth."""
    found = set()
    if isinstance(post_processor, dict):
        for token in (post_processor.get("special_tokens") or {}).values():
            found.update(token.get("tokens", []))
        for sub in post_processor.get("processors") or []:
            found |= template_special_tokens(sub)
    return found


def check(text):
    text.encode("utf-8")  # raises on a lone surrogate
    for ch in text:
        if unicodedata.category(ch) in ("Cn", "Cs"):
            raise ValueError(f"unassigned or surrogate U+{ord(ch):04X} in {text!r:.80}")
    return text


def generate(args):
    tokenizer = json.loads(Path(args.tokenizer_json).read_text(encoding="utf-8"))
    prose_texts = [Path(p).read_text(encoding="utf-8") for p in (args.prose or DEFAULT_PROSE)]
    rng = random.Random(args.seed)
    corpus = Corpus(rng, tokenizer, prose_texts)

    records = [("edge", t) for t in corpus.edge_cases()]
    # A few megabytes of prose: every file whole, then long passages.
    long_prose = [("prose", t) for t in prose_texts]
    prose_bytes = sum(len(t.encode()) for _, t in long_prose)
    while prose_bytes < args.prose_mb * 1e6:
        text = corpus.prose_long()
        long_prose.append(("prose", text))
        prose_bytes += len(text.encode())
    records += long_prose

    rest = max(0, args.count - len(records))
    made = 0
    for kind, weight in WEIGHTS.items():
        n = int(rest * weight)
        gen = getattr(corpus, kind)
        records += [(kind, gen()) for _ in range(n)]
        made += n
    records += [("fuzz", corpus.fuzz()) for _ in range(rest - made)]
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-json", required=True,
                        help="the tokenizer.json whose added tokens to embed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=20000,
                        help="number of strings (never fewer than the fixed cases and prose passages)")
    parser.add_argument("--prose-mb", type=float, default=3.0,
                        help="at least this many megabytes (10^6 bytes) of prose")
    parser.add_argument("--prose", action="append",
                        help="prose file (repeatable; default: data/demo's texts)")
    parser.add_argument("--out", help="output file (default: stdout)")
    args = parser.parse_args()

    records = generate(args)
    out = open(args.out, "w", encoding="utf-8", newline="\n") if args.out else sys.stdout
    with out:
        for kind, text in records:
            out.write(json.dumps({"text": check(text), "kind": kind}, ensure_ascii=False) + "\n")
    sizes = {}
    for kind, text in records:
        n, b = sizes.get(kind, (0, 0))
        sizes[kind] = (n + 1, b + len(text.encode()))
    total = sum(b for _, b in sizes.values())
    print(f"make_tokenizer_corpus: {len(records)} strings, {total / 1e6:.2f} MB: " +
          ", ".join(f"{k} {n} ({b / 1e6:.2f} MB)" for k, (n, b) in sizes.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
