// Generates the tokenizer reference corpus and records what the reference encoder does with it.
//
//   node tests/reference/tokenizer_cases.mjs OUT [--count N] [--seed S] [NAME...]
//
// For each real tokenizer NAME (default: llama3 qwen3 gemma3 llama2) writes
//   OUT/NAME/cases.jsonl    one {"text", "ids", "decoded"} per line: `ids` is the reference
//                           encode of `text` with special tokens added, `decoded` the reference
//                           decode of `ids` with skip_special_tokens=true and
//                           clean_up_tokenization_spaces=false (what a streaming server emits);
//   OUT/NAME/manifest.json  {"name", "package", "version", "models_dir", "count", "seed"}:
//                           models_dir holds the tokenizer.json + tokenizer_config.json that the
//                           reference read and that pdserve must load (they stay in the package).
// The reference is @lenml/tokenizers (derived from transformers.js), built from exactly those two
// files, and every case is checked against Hugging Face's Rust tokenizers library (npm
// `tokenizers`, the library transformers' fast tokenizers run) on the same tokenizer.json: where
// the two disagree nothing is written and the run fails, since the target would be ambiguous.
// The packages come from REFERENCE_TOOLS_DIR (scripts/reference-tools.sh). The corpus is a pure
// function of the seed and the tokenizer's added tokens and config, so two runs write the same
// bytes.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const TOKENIZERS = ["llama3", "qwen3", "gemma3", "llama2"];

function parse_args(argv) {
  const args = { out: null, count: 3000, seed: 14, names: [] };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--count") args.count = Number(argv[++i]);
    else if (a === "--seed") args.seed = Number(argv[++i]);
    else if (a.startsWith("--")) throw new Error(`unknown option ${a}`);
    else if (args.out === null) args.out = a;
    else args.names.push(a);
  }
  if (args.out === null) throw new Error("usage: tokenizer_cases.mjs OUT [--count N] [--seed S] [NAME...]");
  if (!Number.isInteger(args.count) || args.count < 1) throw new Error("--count must be a positive integer");
  if (!Number.isInteger(args.seed)) throw new Error("--seed must be an integer");
  if (args.names.length === 0) args.names = TOKENIZERS;
  for (const n of args.names) {
    if (!TOKENIZERS.includes(n)) throw new Error(`unknown tokenizer ${n} (known: ${TOKENIZERS.join(" ")})`);
  }
  return args;
}

// mulberry32: a small, well-mixed 32-bit PRNG; Math.random cannot be seeded.
function make_rng(seed) {
  let s = seed >>> 0;
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));  // inclusive
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  const chance = (p) => next() < p;
  return { next, int, pick, chance };
}

const cp = (c) => String.fromCodePoint(c);
const range = (lo, hi) => ({ lo, hi });

// Letters (and a few signs) of each script, as code point ranges of long-assigned characters:
// the Unicode versions of node's ICU and of pdserve's libraries agree on these.
const SCRIPTS = {
  latin: [range(0x41, 0x5a), range(0x61, 0x7a)],
  latin_accented: [range(0xc0, 0xd6), range(0xd8, 0xf6), range(0xf8, 0x17f), range(0x1e00, 0x1eff)],
  cyrillic: [range(0x410, 0x44f), range(0x400, 0x40f), range(0x450, 0x45f)],
  greek: [range(0x391, 0x3a1), range(0x3a3, 0x3a9), range(0x3b1, 0x3c9), range(0x1f00, 0x1f15)],
  arabic: [range(0x621, 0x64a), range(0x64b, 0x652), range(0x660, 0x669)],
  hebrew: [range(0x5d0, 0x5ea), range(0x5b0, 0x5bc)],
  devanagari: [range(0x905, 0x939), range(0x93e, 0x94d), range(0x966, 0x96f)],
  thai: [range(0xe01, 0xe30), range(0xe31, 0xe3a), range(0xe40, 0xe4e)],
  cjk: [range(0x4e00, 0x9fa5), range(0x3041, 0x3096), range(0x30a1, 0x30fa), range(0x3001, 0x3002)],
  hangul: [range(0xac00, 0xd7a3)],
};

const COMBINING = range(0x300, 0x36f);
const SKIN_TONES = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff];
const EMOJI = [range(0x1f600, 0x1f64f), range(0x1f300, 0x1f5ff), range(0x1f680, 0x1f6c5), range(0x1f90c, 0x1f9ff), range(0x2600, 0x26ff)];
const ZWJ_SEQUENCES = [
  "\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466}", "\u{1f469}\u200d\u{1f4bb}", "\u{1f3f3}\ufe0f\u200d\u{1f308}",
  "\u{1f468}\u{1f3fd}\u200d\u{1f680}", "\u2764\ufe0f\u200d\u{1f525}", "\u{1f9d1}\u200d\u{1f91d}\u200d\u{1f9d1}",
  "\u{1f441}\ufe0f\u200d\u{1f5e8}\ufe0f", "\u{1f3c3}\u200d\u2640\ufe0f",
];
const SKIN_TONE_BASES = [0x1f44b, 0x1f44d, 0x1f590, 0x270c, 0x1f466, 0x1f467, 0x1f9d1, 0x1f46e];
const FLAG_REGIONS = ["US", "GB", "DE", "FR", "JP", "CN", "KR", "IN", "BR", "UA", "IL", "EG"];

// Characters NFKC changes (and NFC does not): ligatures, fullwidth and halfwidth forms,
// super- and subscripts, circled and parenthesised numbers, roman numerals, squared units, ...
const COMPATIBILITY = [
  range(0xfb00, 0xfb06), range(0xff01, 0xff5e), range(0xff66, 0xff9d), range(0x2070, 0x2079),
  range(0x2080, 0x2089), range(0xb2, 0xb3), range(0xb9, 0xb9), range(0x2460, 0x2473),
  range(0x2474, 0x2487), range(0x2160, 0x217f), range(0x3380, 0x33df), range(0x2100, 0x2122),
  range(0x1d400, 0x1d433), range(0x2002, 0x200a), range(0xbc, 0xbe), range(0x2153, 0x215e),
];
// Spaces of every kind the pre-tokenizers' \s, Metaspace and SentencePiece treat differently.
const SPACES = [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u202f", "\u000b", "\u000c", "\u2028"];
const PUNCTUATION = [".", ",", "!", "?", ";", ":", "-", "--", "\u2014", "\u2026", "'", "\"", "(", ")", "[", "]", "{", "}", "...", "\u00bf", "\u00a1", "\u3002", "\uff0c", "\u00ab", "\u00bb", "\u201c", "\u201d", "\u2019", "&", "@", "#", "$", "%", "*", "/", "\\", "|", "~", "`", "^", "+", "=", "<", ">", "_"];
const NON_ASCII_DIGITS = [range(0x660, 0x669), range(0x966, 0x96f), range(0xff10, 0xff19), range(0x6f0, 0x6f9), range(0xe50, 0xe59)];

const WORDS = (
  "the of and to in is you that it he was for on are as with his they at be this have from or one " +
  "had by word but not what all were we when your can said there use an each which she do how their " +
  "if will up other about out many then them these so some her would make like him into time has " +
  "look two more write go see number no way could people my than first water been call who oil its " +
  "now find long down day did get come made may part tokenizer server model prefill decode cache " +
  "Hello World OpenAI GPU NVIDIA Llama Qwen Gemma JSON HTTP naïve café résumé façade coöperate"
).split(" ");
const CONTRACTIONS = ["don't", "I'm", "they'll", "we've", "she'd", "it's", "can't", "won't", "you're", "DON'T", "It'S", "y'all", "'tis", "o'clock", "rock'n'roll", "isn\u2019t"];

function from_ranges(rng, ranges) {
  const r = rng.pick(ranges);
  return cp(rng.int(r.lo, r.hi));
}

function word_of(rng, ranges, min, max) {
  let w = "";
  for (let n = rng.int(min, max); n > 0; --n) w += from_ranges(rng, ranges);
  return w;
}

function spaces(rng) { return rng.pick(SPACES); }

// Latin words, accented either precomposed (é) or decomposed (e + U+0301) — NFC tells them apart —
// sometimes with stacked combining marks that have no precomposed form.
function accents(rng) {
  const out = [];
  for (let n = rng.int(1, 8); n > 0; --n) {
    let w = "";
    for (let k = rng.int(1, 10); k > 0; --k) {
      const roll = rng.next();
      if (roll < 0.4) w += from_ranges(rng, SCRIPTS.latin);
      else if (roll < 0.65) w += from_ranges(rng, SCRIPTS.latin_accented);
      else if (roll < 0.9) w += from_ranges(rng, SCRIPTS.latin_accented).normalize("NFD");
      else {
        w += from_ranges(rng, SCRIPTS.latin);
        for (let m = rng.int(1, 3); m > 0; --m) w += from_ranges(rng, [COMBINING]);
      }
    }
    out.push(w);
  }
  return out.join(rng.chance(0.8) ? " " : spaces(rng));
}

// Hangul as syllables and as conjoining jamo (L V [T]), which NFC composes into syllables.
function hangul(rng) {
  let s = "";
  for (let n = rng.int(1, 12); n > 0; --n) {
    const roll = rng.next();
    if (roll < 0.5) s += from_ranges(rng, SCRIPTS.hangul);
    else if (roll < 0.9) {
      s += cp(rng.int(0x1100, 0x1112)) + cp(rng.int(0x1161, 0x1175));
      if (rng.chance(0.5)) s += cp(rng.int(0x11a8, 0x11c2));
    } else s += " ";
  }
  return s;
}

function emoji(rng) {
  let s = "";
  for (let n = rng.int(1, 8); n > 0; --n) {
    const roll = rng.next();
    if (roll < 0.35) s += from_ranges(rng, EMOJI);
    else if (roll < 0.5) s += cp(rng.pick(SKIN_TONE_BASES)) + cp(rng.pick(SKIN_TONES));
    else if (roll < 0.65) s += rng.pick(ZWJ_SEQUENCES);
    else if (roll < 0.75) s += [...rng.pick(FLAG_REGIONS)].map((c) => cp(0x1f1e6 + c.charCodeAt(0) - 65)).join("");
    else if (roll < 0.82) s += `${rng.int(0, 9)}\ufe0f\u20e3`;  // keycap
    else if (roll < 0.9) s += from_ranges(rng, EMOJI) + "\ufe0f";
    else s += " " + rng.pick(WORDS) + " ";
  }
  return s;
}

function compatibility(rng) {
  let s = "";
  for (let n = rng.int(1, 10); n > 0; --n) {
    s += rng.chance(0.7) ? from_ranges(rng, COMPATIBILITY) : rng.pick(WORDS);
    if (rng.chance(0.3)) s += " ";
  }
  return s;
}

// Words of one to four scripts mixed, separated by spaces and punctuation.
function scripts(rng) {
  const names = Object.keys(SCRIPTS);
  const chosen = [];
  for (let n = rng.int(1, 4); n > 0; --n) chosen.push(rng.pick(names));
  const parts = [];
  for (let n = rng.int(1, 10); n > 0; --n) {
    const script = rng.pick(chosen);
    const w = script === "hangul" ? hangul(rng) : word_of(rng, SCRIPTS[script], 1, 8);
    parts.push(w);
    parts.push(rng.chance(0.7) ? " " : rng.chance(0.5) ? rng.pick(PUNCTUATION) : spaces(rng));
  }
  return parts.join("");
}

function combining_marks(rng) {
  let s = "";
  for (let n = rng.int(1, 10); n > 0; --n) {
    const script = rng.pick(["latin", "cyrillic", "greek", "arabic", "hebrew", "devanagari", "thai"]);
    s += from_ranges(rng, SCRIPTS[script]);
    for (let m = rng.int(0, 4); m > 0; --m) s += from_ranges(rng, [COMBINING, range(0x1ab0, 0x1abd), range(0x20d0, 0x20dc)]);
    if (rng.chance(0.25)) s += " ";
  }
  return s;
}

function whitespace(rng) {
  let s = rng.chance(0.5) ? spaces(rng).repeat(rng.int(1, 4)) : "";
  for (let n = rng.int(1, 8); n > 0; --n) {
    s += rng.pick(WORDS);
    let run = "";
    for (let k = rng.int(1, 6); k > 0; --k) run += spaces(rng);
    s += run;
  }
  if (rng.chance(0.5)) s = s.trimEnd();
  return s;
}

function digit_string(rng, length) {
  let s = String(rng.int(1, 9));
  while (s.length < length) s += String(rng.int(0, 9));
  return s.slice(0, length);
}

function digits(rng) {
  const roll = rng.next();
  if (roll < 0.4) return digit_string(rng, rng.int(1, 40));
  if (roll < 0.55) return `${rng.pick(WORDS)} ${digit_string(rng, rng.int(1, 12))}${rng.pick(WORDS)} ${digit_string(rng, rng.int(1, 7))}`;
  if (roll < 0.7) return `${rng.int(0, 999)},${digit_string(rng, 3)},${digit_string(rng, 3)}.${digit_string(rng, rng.int(1, 4))}`;
  if (roll < 0.8) return `${rng.int(1900, 2099)}-${String(rng.int(1, 12)).padStart(2, "0")}-${String(rng.int(1, 28)).padStart(2, "0")} ${rng.int(0, 23)}:${String(rng.int(0, 59)).padStart(2, "0")}`;
  if (roll < 0.9) return `v${rng.int(0, 20)}.${rng.int(0, 99)}.${rng.int(0, 999)} 0x${rng.int(0, 0xffffff).toString(16)} ${-rng.int(0, 1e6) / 1000}e${rng.int(-20, 20)}`;
  let s = "";
  for (let n = rng.int(1, 12); n > 0; --n) s += from_ranges(rng, NON_ASCII_DIGITS);
  return s;
}

function identifier(rng) {
  const w = rng.pick(WORDS).replace(/[^a-zA-Z]/g, "") || "x";
  return rng.chance(0.3) ? `${w}_${rng.pick(WORDS).replace(/[^a-zA-Z]/g, "")}${rng.int(0, 99)}` : w;
}

function code(rng) {
  const indent = rng.pick(["  ", "    ", "\t"]);
  const a = identifier(rng), b = identifier(rng), c = identifier(rng);
  const n = rng.int(0, 100000);
  const snippets = [
    `def ${a}(${b}, ${c}=None):\n${indent}"""${rng.pick(WORDS)} ${rng.pick(WORDS)}."""\n${indent}if ${b} is None:\n${indent}${indent}return []\n${indent}return [x * ${n} for x in ${b} if x != '${c}']\n`,
    `import os\n\nclass ${a.charAt(0).toUpperCase() + a.slice(1)}:\n${indent}def __init__(self):\n${indent}${indent}self.${b} = {}  # ${rng.pick(CONTRACTIONS)}\n\n\nprint(f"{${c}!r:>10}", end='')\n`,
    `#include <vector>\n\nint ${a}(const std::vector<int>& ${b}) {\n${indent}int ${c} = 0;\n${indent}for (int i = 0; i < ${n}; ++i) ${c} += ${b}[i] << 2;\n${indent}return ${c} != 0 ? ${c} : -1;\n}\n`,
    `template <typename T>\nauto ${a}(T&& ${b}) -> decltype(${b}.size()) { return ${b}.size(); }  // ${rng.pick(WORDS)}\n`,
    JSON.stringify({ [a]: n, [b]: [rng.pick(WORDS), n / 7, null, true], [c]: { "nested": rng.pick(CONTRACTIONS), "emoji": "\u{1f600}" } }, null, rng.pick([0, 2, 4])),
    `{"${a}":${n},"${b}":"${rng.pick(WORDS)}\\n\\t\\u00e9","${c}":[1,2,3]}`,
    `SELECT ${a}, COUNT(*) FROM ${b} WHERE ${c} >= ${n} GROUP BY ${a};`,
    `<div class="${a}">\n${indent}<a href="https://example.com/${b}?q=${n}&lang=en">${rng.pick(WORDS)}</a>\n</div>`,
    `$ ./${a} --${b}=${n} | grep -v '${c}' >> /tmp/${a}.log 2>&1`,
  ];
  return rng.pick(snippets);
}

function prose(rng) {
  const sentences = [];
  for (let n = rng.int(1, 5); n > 0; --n) {
    const words = [];
    for (let k = rng.int(3, 15); k > 0; --k) words.push(rng.chance(0.15) ? rng.pick(CONTRACTIONS) : rng.pick(WORDS));
    let s = words.join(" ");
    s = s.charAt(0).toUpperCase() + s.slice(1);
    if (rng.chance(0.2)) s = `"${s}," ${rng.pick(["she said", "he asked", "they wrote"])}`;
    if (rng.chance(0.15)) s += ` (${rng.pick(WORDS)}; ${rng.pick(WORDS)})`;
    sentences.push(s + rng.pick([".", ".", "!", "?", "...", ":", ";"]));
  }
  return sentences.join(rng.chance(0.8) ? " " : rng.pick(["\n", "\n\n", "  "]));
}

// The added tokens a prompt really carries: those the chat template writes or the config names
// (bos_token, eos_token, ...). Most of a big list is reserved (<unused17>), and a uniform draw
// would seldom embed <|eot_id|> or <start_of_turn>.
function prominent_tokens(added, tokenizer_config) {
  const template = JSON.stringify(tokenizer_config.chat_template ?? "");
  const named = new Set();
  for (const [key, value] of Object.entries(tokenizer_config)) {
    if (!key.endsWith("_token") || value === null) continue;
    named.add(typeof value === "object" ? value.content : value);
  }
  return added.filter((t) => named.has(t) || template.includes(JSON.stringify(t).slice(1, -1)));
}

// The tokenizer's own added tokens (special or not) embedded in text: next to words, spaces
// and newlines (lstrip/rstrip/single_word matter there), adjacent to each other, and truncated.
function added_token_text(rng, { prominent, added }) {
  const parts = [];
  if (rng.chance(0.3)) parts.push(rng.pick(["", " ", "\n", "Hi", "  "]));
  for (let n = rng.int(1, 5); n > 0; --n) {
    const tok = prominent.length && rng.chance(0.6) ? rng.pick(prominent) : rng.pick(added);
    const roll = rng.next();
    if (roll < 0.1 && tok.length > 2) parts.push(tok.slice(0, rng.int(1, tok.length - 1)));
    else parts.push(tok);
    const after = rng.next();
    if (after < 0.3) parts.push(rng.pick(["user\n", "assistant\n", "system\n", "model\n"]));
    else if (after < 0.55) parts.push(rng.pick([" ", "\n", "  ", "\n\n", " x", "x"]));
    else if (after < 0.85) parts.push((rng.chance(0.5) ? " " : "") + prose(rng));
  }
  return parts.join("");
}

// Strings every tokenizer gets, whatever the seed: the edges of each component.
function fixed_cases({ prominent }) {
  const cases = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "é", "e\u0301", "\u00a0", "\u3000",
    "a".repeat(1000), "ab".repeat(500), " ".repeat(300), "\n".repeat(100), "\t".repeat(50),
    "1234567890".repeat(50), "\u{1f600}".repeat(100), "\u4e2d".repeat(200), "e\u0301".repeat(200),
    " Hello", "Hello ", " Hello world ", "Hello world", "hello\n\nworld", "  leading and trailing  ",
    "I'm don't we'll they've she'd it's", "HELLO'S", "1", "12", "123", "1234", "12345",
    "\ufb01nancial \uff21\uff22\uff23 x\u00b2 \u2460 \u2163 \u3392",
    "\u1100\u1161\u11a8 \uac01", "\u{1f468}\u200d\u{1f469}\u200d\u{1f467} \u{1f44d}\u{1f3fd} \u{1f1fa}\u{1f1f8}",
  ];
  for (const tok of prominent) cases.push(tok, ` ${tok} `, `${tok}${tok}`, `a${tok}b`, `${tok}\n`);
  return cases;
}

const GENERATORS = [
  [accents, 10], [hangul, 4], [emoji, 6], [compatibility, 6], [scripts, 16], [combining_marks, 5],
  [whitespace, 10], [digits, 8], [code, 10], [prose, 12], ["added", 10], ["repeat", 3],
];

function repeat(rng) {
  const unit = rng.pick(["a", "ab", " ", "\n", "=", "-", "the ", "\u00e9", "e\u0301", "\u4e2d", "\u{1f600}", "1", "\t", "xyz "]);
  return unit.repeat(rng.int(10, 400));
}

function generate(rng, count, added) {
  const out = fixed_cases(added).slice(0, count);
  const total = GENERATORS.reduce((s, [, w]) => s + w, 0);
  while (out.length < count) {
    let r = rng.next() * total;
    let gen = GENERATORS[GENERATORS.length - 1][0];
    for (const [g, w] of GENERATORS) {
      if ((r -= w) < 0) { gen = g; break; }
    }
    if (gen === "added") out.push(added.added.length ? added_token_text(rng, added) : prose(rng));
    else if (gen === "repeat") out.push(repeat(rng));
    else out.push(gen(rng));
  }
  return out;
}

function seed_for(seed, name) {
  // The same corpus shape for every tokenizer, but not the same draws after the added tokens.
  let h = seed >>> 0;
  for (const c of name) h = Math.imul(h ^ c.charCodeAt(0), 0x01000193) >>> 0;
  return h;
}

// The first few cases where the Rust library encodes or decodes differently from the recorded ones.
async function rust_disagreements(rust, records, limit) {
  const found = [];
  for (const [index, r] of records.entries()) {
    const ids = (await rust.encode(r.text, null, { addSpecialTokens: true })).getIds();
    const decoded = await rust.decode(r.ids, true);
    if (JSON.stringify(ids) !== JSON.stringify(r.ids) || decoded !== r.decoded) {
      found.push({ index, text: r.text, ids: r.ids, rust_ids: ids, decoded: r.decoded, rust_decoded: decoded });
      if (found.length === limit) break;
    }
  }
  return found;
}

async function main() {
  const args = parse_args(process.argv.slice(2));
  const tools = process.env.REFERENCE_TOOLS_DIR;
  if (!tools) throw new Error("REFERENCE_TOOLS_DIR is not set: eval \"$(scripts/reference-tools.sh)\"");
  const require = createRequire(path.join(tools, "package.json"));
  const { TokenizerLoader } = require("@lenml/tokenizers");
  const { Tokenizer: RustTokenizer } = require("tokenizers");
  let failed = false;
  for (const name of args.names) {
    const pkg = `@lenml/tokenizer-${name}`;
    const models_dir = path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
    const version = JSON.parse(fs.readFileSync(path.join(models_dir, "..", "package.json"), "utf8")).version;
    const tokenizer_json = JSON.parse(fs.readFileSync(path.join(models_dir, "tokenizer.json"), "utf8"));
    const tokenizer_config = JSON.parse(fs.readFileSync(path.join(models_dir, "tokenizer_config.json"), "utf8"));
    const started = Date.now();
    const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON: tokenizer_json, tokenizerConfig: tokenizer_config });
    const all_added = tokenizer_json.added_tokens.map((t) => t.content);
    const added = { prominent: prominent_tokens(all_added, tokenizer_config), added: all_added };
    const texts = generate(make_rng(seed_for(args.seed, name)), args.count, added);
    const records = texts.map((text) => {
      const ids = tokenizer.encode(text);
      // The reference's decode refuses an empty list (the empty string without BOS); it is "".
      const decoded = ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
      return { text, ids, decoded };
    });
    const recorded = Date.now();
    const rust = RustTokenizer.fromFile(path.join(models_dir, "tokenizer.json"));
    const disagreements = await rust_disagreements(rust, records, 5);
    const timing = `record ${(recorded - started) / 1000} s, Rust check ${(Date.now() - recorded) / 1000} s`;
    if (disagreements.length > 0) {
      console.error(`tokenizer_cases: ${name}: the Rust tokenizers library disagrees with the reference (${timing}); nothing written:`);
      for (const d of disagreements) console.error(JSON.stringify(d));
      failed = true;
      continue;
    }
    const dir = path.join(args.out, name);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "cases.jsonl"), records.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const manifest = { name, package: pkg, version, models_dir, count: texts.length, seed: args.seed };
    fs.writeFileSync(path.join(dir, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
    console.error(`tokenizer_cases: ${name}: ${texts.length} cases, the Rust library agrees on all (${timing})`);
  }
  if (failed) process.exit(1);
}

await main();
