"""Writes server/prompt/testdata/harmony/renderings.json: transformers'
`apply_chat_template` of gpt-oss's chat template (the committed
chat_template.jinja) for messages in OpenAI's shape, with tools, a tool-call
and tool-result round and each reasoning effort. Run with the reference
venv (/root/.cache/ferrox/venv-ref/bin/python); `--check` compares with the
committed file instead of writing it."""

import argparse
import copy
import json
import pathlib
import sys

import tokenizers
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIR = ROOT / "server" / "prompt" / "testdata" / "harmony"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    }, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}

USER = {"role": "user", "content": "What is the weather in Oslo?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}

# (name, messages, tools, template variables, add_generation_prompt)
CASES = [
    ("plain", [USER], None, {}, True),
    ("system_and_effort_low", [{"role": "system", "content": "Answer briefly."}, USER], None,
     {"reasoning_effort": "low"}, True),
    ("effort_high", [USER], None, {"reasoning_effort": "high"}, True),
    ("tools", [{"role": "developer", "content": "Use tools."}, USER], [WEATHER, NOW], {}, True),
    ("tool_round", [USER, CALL, RESULT], [WEATHER], {"reasoning_effort": "low"}, True),
    ("answered_round", [USER, CALL, RESULT,
                        {"role": "assistant", "content": "It is 21 degrees and clear."},
                        {"role": "user", "content": "Thanks!"}], [WEATHER], {}, True),
    # The call's reasoning sent back (vLLM's `reasoning_content`; the
    # template reads `thinking`) is rendered before the call.
    ("tool_round_with_reasoning", [USER, {**CALL, "reasoning_content": "Need the weather."},
                                   RESULT], [WEATHER], {}, True),
    ("no_generation_prompt", [USER, {"role": "assistant", "content": "Sunny."}], None, {}, False),
]


def for_transformers(messages):
    """Tool call arguments as objects, as transformers' templates take them
    (our server parses them the same way before rendering), and reasoning
    as `thinking`, which gpt-oss's template reads."""
    out = copy.deepcopy(messages)
    for m in out:
        if "reasoning_content" in m:
            m["thinking"] = m.pop("reasoning_content")
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def render(template: str) -> list:
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=inner)
    out = []
    for name, messages, tools, kwargs, gen in CASES:
        text = tok.apply_chat_template(for_transformers(messages), tools=tools, tokenize=False,
                                       add_generation_prompt=gen, chat_template=template, **kwargs)
        out.append({"name": name, "messages": messages, "tools": tools, "kwargs": kwargs,
                    "add_generation_prompt": gen, "rendered": text})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    template = (DIR / "chat_template.jinja").read_text()
    text = json.dumps(render(template), indent=1, ensure_ascii=False) + "\n"
    path = DIR / "renderings.json"
    if args.check:
        # The date line is the day's: compare without it.
        strip = lambda t: [l for l in t.splitlines() if "Current date:" not in l]
        if strip(path.read_text()) != strip(text):
            print(f"{path} is out of date", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
