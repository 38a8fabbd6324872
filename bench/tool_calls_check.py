#!/usr/bin/env python3
"""Tool calls under tool_choice required and a named function, against a running kvvm serve:
every answer's calls parsed and validated against the tools' schemas (python3-jsonschema), and
each streamed answer's accumulated calls compared with the whole answer of the same seed.

Usage: bench/tool_calls_check.py URL MODEL [--seeds N] [--temperature T]
  e.g. kvvm serve --model tests/data/models/qwen3-tiny \\
         --chat-template models/kvvm-adder/chat_template.jinja --port 8000 &
       bench/tool_calls_check.py http://127.0.0.1:8000 qwen3-tiny --seeds 200
Prints one line per mode and exits 1 when any call failed to parse or validate, or a stream
differed from its whole answer.
"""
import argparse
import json
import sys
import urllib.request

import jsonschema

OPERAND = {"type": "integer", "minimum": 0, "maximum": 999}
TOOLS = [
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": {"type": "object", "properties": {"a": OPERAND, "b": OPERAND},
                       "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "echo", "description": "Repeats a text",
        "parameters": {"type": "object",
                       "properties": {"text": {"type": "string", "maxLength": 12},
                                      "times": {"type": "integer", "minimum": 1, "maximum": 3}},
                       "required": ["text"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MODES = {
    "required": "required",
    "required, one call": "required",
    "named (echo)": {"type": "function", "function": {"name": "echo"}},
}


def post(url, body):
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        if not body.get("stream"):
            return json.load(response)
        calls, finish = {}, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
            for piece in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"name": None, "arguments": ""})
                if "id" in piece:
                    call["name"] = piece["function"]["name"]
                call["arguments"] += piece["function"]["arguments"]
        return [calls[i] for i in sorted(calls)], finish


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    failed = False
    for mode, choice in MODES.items():
        valid = calls_total = same = cut = 0
        problems = []
        for seed in range(args.seeds):
            body = {"model": args.model, "tools": TOOLS, "tool_choice": choice, "seed": seed,
                    "temperature": args.temperature, "max_tokens": 200,
                    "parallel_tool_calls": mode != "required, one call",
                    "messages": [{"role": "user", "content": "What is 482 + 39?"}]}
            whole = post(args.url, body)["choices"][0]
            calls = whole["message"].get("tool_calls") or []
            cut += whole["finish_reason"] == "length"
            ok = whole["finish_reason"] == "tool_calls" and len(calls) >= 1
            if mode == "required, one call":
                ok = ok and len(calls) == 1
            for call in calls:
                calls_total += 1
                try:
                    name = call["function"]["name"]
                    if isinstance(choice, dict):
                        assert name == choice["function"]["name"], name
                    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
                except Exception as error:  # noqa: BLE001 - every failure is reported
                    ok = False
                    problems.append(f"seed {seed}: {error}")
            valid += ok
            streamed, finish = post(args.url, dict(body, stream=True))
            flat = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    for c in calls]
            same += streamed == flat and finish == whole["finish_reason"]
        print(f"{mode}: {valid}/{args.seeds} answers are calls that all validate ({calls_total} "
              f"calls returned, {len(problems)} invalid; {cut} answers cut by max_tokens); "
              f"streamed equal to whole: {same}/{args.seeds}")
        for problem in problems[:5]:
            print("  " + problem)
        failed = failed or valid != args.seeds or same != args.seeds
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
