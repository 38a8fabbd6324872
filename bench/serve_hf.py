#!/usr/bin/env python3
"""serve_hf.py: a plain HTTP wrapper of Hugging Face transformers, OpenAI-compatible
enough for `kvvm bench serve` to load it the way it loads `kvvm serve` and vLLM.

It is what a plain HF deployment does: ONE REQUEST AT A TIME. Generation runs under a single
lock, so concurrent requests queue on it (each holds its HTTP thread while it waits) and the
model never batches across requests. That is the point of the comparison: the other side
batches (continuous batching) and shares prefixes.

Endpoints (Python stdlib http.server, ThreadingHTTPServer; torch and transformers, nothing else):
  GET  /v1/models            {"object": "list", "data": [{"id": NAME, ...}]}
  GET  /health               200 "ok"
  POST /v1/completions       prompt: a string or an array of token ids; max_tokens (default 16),
                             temperature (0: greedy; else sampling with that temperature), seed,
                             stream (Server-Sent Events: a chunk per token, then a usage chunk
                             when stream_options.include_usage, then data: [DONE]), anything else
                             ignored (this is a benchmark stand-in, not a validating server)
  POST /v1/chat/completions  messages through the tokenizer's chat template when it has one
                             (400 otherwise), the same options
Generation is token by token with the model's KV cache (a forward pass over the prompt, then
one per new token, as `generate` does), so each token is streamed when it is made. It stops
at max_tokens or at the end-of-sequence token. A prompt + max_tokens past the model's
max_position_embeddings is a 400.

Usage: python3 bench/serve_hf.py --model DIR [--port 8001] [--host 127.0.0.1]
       [--device cuda] [--dtype bfloat16] [--name NAME]
Prints "serve_hf: ready on http://HOST:PORT" once the model is loaded and the port bound;
SIGTERM stops it (exit 0; requests still running are dropped).
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import transformers
from transformers import AutoModelForCausalLM

MAX_BODY_BYTES = 8 << 20


class ApiError(Exception):
    def __init__(self, status, message, kind="invalid_request_error", param=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def load_tokenizer(directory):
    try:
        return transformers.AutoTokenizer.from_pretrained(directory)
    except Exception:  # a bare tokenizer.json (bench/generate_hf.py's random checkpoints)
        return transformers.PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(directory, "tokenizer.json"))


class Generator:
    """The model, its tokenizer and the lock every generation holds."""

    def __init__(self, directory, device, dtype, name):
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.tokenizer = load_tokenizer(directory)
        self.name = name or os.path.basename(os.path.normpath(directory))
        self.context = getattr(self.model.config, "max_position_embeddings", 4096)
        self.vocab = self.model.config.vocab_size
        eos = self.model.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.lock = threading.Lock()

    def prompt_ids(self, body, chat):
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty array", param="messages")
            if not getattr(self.tokenizer, "chat_template", None):
                raise ApiError(400, "the model has no chat template", param="messages")
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < self.vocab
                for v in prompt):
            return prompt
        raise ApiError(400, f"prompt must be a string or an array of token ids in "
                            f"[0, {self.vocab})", param="prompt")

    @torch.inference_mode()
    def generate(self, ids, max_tokens, temperature, seed):
        """Yields each new token id; runs under the lock (one request at a time)."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        with self.lock:
            out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True)
            for _ in range(max_tokens):
                logits = out.logits[:, -1, :].float()
                if temperature <= 0:
                    token = torch.argmax(logits, dim=-1)
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    token = torch.multinomial(probs, 1, generator=generator)[:, 0]
                value = int(token.item())
                yield value
                if value in self.eos:
                    return
                out = self.model(input_ids=token.view(1, 1), past_key_values=out.past_key_values,
                                 use_cache=True)


def make_handler(gen):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the bench sends many requests
            pass

        def send_json(self, status, obj, headers=()):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def send_error_json(self, error):
            self.send_json(error.status, {"error": {"message": error.message, "type": error.kind,
                                                    "param": error.param, "code": None}})

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": gen.name, "object": "model", "created": 0, "owned_by": "hf"}]})
            elif self.path == "/health":
                self.send_json(200, {"status": "ok"})
            else:
                self.send_error_json(ApiError(404, f"no such path {self.path}", "not_found_error"))

        def do_POST(self):
            try:
                chat = self.path == "/v1/chat/completions"
                if not chat and self.path != "/v1/completions":
                    raise ApiError(404, f"no such path {self.path}", "not_found_error")
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > MAX_BODY_BYTES:
                    raise ApiError(413 if length > 0 else 400,
                                   f"the body must be 1 to {MAX_BODY_BYTES} bytes")
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError as error:
                    raise ApiError(400, f"the body is not JSON: {error}")
                if not isinstance(body, dict):
                    raise ApiError(400, "the body must be a JSON object")
                ids = gen.prompt_ids(body, chat)
                max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
                if not isinstance(max_tokens, int) or max_tokens < 1:
                    raise ApiError(400, "max_tokens must be a whole number >= 1",
                                   param="max_tokens")
                if len(ids) + max_tokens > gen.context:
                    raise ApiError(400, f"prompt {len(ids)} + max_tokens {max_tokens} tokens "
                                        f"exceed the context of {gen.context}", param="max_tokens")
                temperature = float(body.get("temperature", 1.0) or 0.0)
                seed = int(body.get("seed", 0) or 0)
                stream = bool(body.get("stream", False))
                options = body.get("stream_options") or {}
                usage = bool(options.get("include_usage", False)) if stream else True
            except ApiError as error:
                self.send_error_json(error)
                return
            except (TypeError, ValueError) as error:
                self.send_error_json(ApiError(400, f"bad field: {error}"))
                return
            tokens = gen.generate(ids, max_tokens, temperature, seed)
            if stream:
                self.stream(tokens, len(ids), chat, usage)
            else:
                self.whole(tokens, len(ids), chat)

        def reply_ids(self, tokens, sink):
            """Runs the generation, calling sink(text delta) per token; returns the ids."""
            made, text = [], ""
            for token in tokens:
                made.append(token)
                full = gen.tokenizer.decode(made, skip_special_tokens=True)
                sink(full[len(text):])
                text = full
            return made, text

        def whole(self, tokens, prompt_tokens, chat):
            made, text = self.reply_ids(tokens, lambda delta: None)
            finish = "stop" if made and made[-1] in gen.eos else "length"
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": finish} if chat else
                      {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
            self.send_json(200, {
                "id": "cmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": gen.name,
                "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(made),
                          "total_tokens": prompt_tokens + len(made)}})

        def stream(self, tokens, prompt_tokens, chat, usage):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            rid = "cmpl-" + uuid.uuid4().hex
            kind = "chat.completion.chunk" if chat else "text_completion"

            def event(obj):
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                data += b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def chunk(delta, finish=None):
                choice = ({"index": 0, "delta": {"content": delta}, "finish_reason": finish}
                          if chat else {"index": 0, "text": delta, "finish_reason": finish})
                event({"id": rid, "object": kind, "created": int(time.time()), "model": gen.name,
                       "choices": [choice]})

            try:
                if chat:
                    event({"id": rid, "object": kind, "created": int(time.time()),
                           "model": gen.name, "choices": [{"index": 0, "delta": {
                               "role": "assistant", "content": ""}, "finish_reason": None}]})
                made, _ = self.reply_ids(tokens, chunk)
                chunk("", "stop" if made and made[-1] in gen.eos else "length")
                if usage:
                    event({"id": rid, "object": kind, "created": int(time.time()),
                           "model": gen.name, "choices": [], "usage": {
                               "prompt_tokens": prompt_tokens, "completion_tokens": len(made),
                               "total_tokens": prompt_tokens + len(made)}})
                event(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                tokens.close()  # the client went away: stop generating, release the lock
            self.close_connection = True

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--name", default="", help="model id (default: the directory's name)")
    args = parser.parse_args()
    gen = Generator(args.model, args.device, args.dtype, args.name)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(gen))
    server.daemon_threads = True
    # SIGTERM (how serve-gpu.sh stops it) ends serve_forever and exits 0; shutdown() must
    # run on another thread than serve_forever's.
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"serve_hf: ready on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    print("serve_hf: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
