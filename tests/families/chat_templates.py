"""Writes server/prompt/testdata/templates/<family>/renderings.json: what
transformers' `apply_chat_template` renders of each family's own chat
template (its chat_template.jinja beside it, model data as llama.cpp ships
it in models/templates/) for messages in OpenAI's shape: a system turn,
tools, a tool-call and tool-result round with the call's reasoning sent
back, an answered round, the thinking switch on and off, and each family's
own variables. `server/prompt/tests/chat_templates.rs` renders the same
cases through our path and compares. Run with the reference venv
(/root/.cache/ferrox/venv-ref/bin/python); `--llama-src` copies a template
that is not here yet; `--check` compares with the committed files instead
of writing them."""

import argparse
import copy
import json
import pathlib
import shutil
import sys

import tokenizers
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIR = ROOT / "server" / "prompt" / "testdata" / "templates"

# Folder name: (the file in llama.cpp's models/templates/, the family's own
# cases as (name, template variables)).
TEMPLATES = {
    "gpt-oss": ("openai-gpt-oss-120b.jinja",
                [("effort_low", {"reasoning_effort": "low"}),
                 ("effort_high", {"reasoning_effort": "high"})]),
    "qwen35": ("Qwen3.5-4B.jinja", []),
    "glm45": ("GLM-4.6.jinja", []),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", []),
    "gemma4": ("google-gemma-4-31B-it.jinja", []),
    "ministral3": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", []),
    "deepseek-v3": ("deepseek-ai-DeepSeek-V3.1.jinja", [("thinking", {"thinking": True})]),
    "nemotron-h": ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", []),
    "granitehybrid": ("ibm-granite-granite-4.0.jinja", []),
    # Its tool rounds call `list.append`, which transformers' sandbox (and
    # ours) refuses.
    "kimi-k2": ("Kimi-K2-Thinking.jinja", []),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    }, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}

SYSTEM = {"role": "system", "content": "Answer briefly."}
USER = {"role": "user", "content": "What is the weather in Oslo?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
ANSWER = {"role": "assistant", "content": "It is 21 degrees and clear."}

# (name, messages, tools, template variables, add_generation_prompt)
CASES = [
    ("plain", [USER], None, {}, True),
    ("system", [SYSTEM, USER], None, {}, True),
    ("thinking_on", [USER], None, {"enable_thinking": True}, True),
    ("thinking_off", [SYSTEM, USER], None, {"enable_thinking": False}, True),
    ("tools", [SYSTEM, USER], [WEATHER, NOW], {}, True),
    ("tool_round", [USER, CALL, RESULT], [WEATHER], {}, True),
    # The call's reasoning sent back (vLLM's `reasoning_content`; our path
    # gives templates it as `thinking` too).
    ("tool_round_with_reasoning", [USER, {**CALL, "reasoning_content": "Need the weather."},
                                   RESULT], [WEATHER], {}, True),
    ("answered_round", [USER, CALL, RESULT, ANSWER, {"role": "user", "content": "Thanks!"}],
     [WEATHER], {}, True),
    ("earlier_reasoning", [USER, {**ANSWER, "reasoning_content": "Oslo, so cold."},
                           {"role": "user", "content": "And tomorrow?"}], None, {}, True),
    ("no_generation_prompt", [USER, {"role": "assistant", "content": "Sunny."}], None, {}, False),
]


def for_transformers(messages):
    """Messages as our path hands them to a template: tool call arguments
    as objects (the server parses them before rendering), reasoning under
    both `reasoning_content` and `thinking`."""
    out = copy.deepcopy(messages)
    for m in out:
        if "reasoning_content" in m:
            m["thinking"] = m["reasoning_content"]
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def render(template: str, own: list) -> list:
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>",
                                               eos_token="</s>")
    cases = CASES + [(name, [SYSTEM, USER], None, kw, True) for name, kw in own]
    out = []
    for name, messages, tools, kwargs, gen in cases:
        try:
            text = tok.apply_chat_template(for_transformers(messages), tools=tools,
                                           tokenize=False, add_generation_prompt=gen,
                                           chat_template=template, **kwargs)
        except Exception as e:  # the template refuses: ours must too
            text, error = None, f"{type(e).__name__}: {e}"
        else:
            error = None
        out.append({"name": name, "messages": messages, "tools": tools, "kwargs": kwargs,
                    "add_generation_prompt": gen, "rendered": text, "error": error})
    return out


def dateless(text: str) -> list:
    # gpt-oss writes the day's date.
    return [l for l in text.splitlines() if "Current date:" not in l]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--llama-src", type=pathlib.Path, help="llama.cpp source (peer-llama src)")
    args = ap.parse_args()
    stale = []
    for name, (source, own) in TEMPLATES.items():
        path = DIR / name / "chat_template.jinja"
        if not path.exists():
            if args.llama_src is None:
                print(f"{path} is missing: pass --llama-src", file=sys.stderr)
                return 2
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(args.llama_src / "models" / "templates" / source, path)
        text = json.dumps(render(path.read_text(), own), indent=1, ensure_ascii=False) + "\n"
        out = DIR / name / "renderings.json"
        if args.check:
            if not out.exists() or dateless(out.read_text()) != dateless(text):
                stale.append(str(out))
        else:
            out.write_text(text)
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
