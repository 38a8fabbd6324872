#!/usr/bin/python3
"""An independent router fed by `kvvm serve`'s KV events, checked against kvvm's hits.

Starts `kvvm serve` with --kv-events-config, subscribes to its ZeroMQ PUB socket as a router
built for vLLM would (python3-zmq, python3-msgpack: nothing of kvvm's code), and keeps an index
of the blocks stored and not removed. It recomputes every block's hash from its parent and its
token ids (XXH3-64 through libxxhash, the scheme docs/ARCHITECTURE.md "KV events" documents),
so the index is keyed the way a router that hashes prompts itself would key it. Then it sends
requests of two tenants with shared prefixes, and enough distinct prompts under a small KV
budget that the cache evicts, and checks for every request that the tokens kvvm reports cached
(usage.prompt_tokens_details.cached_tokens) are exactly the longest chain of the prompt's
blocks the index holds: the router's match agrees with kvvm's hits. It restarts the server
midway (the second run publishing the map layout, the first the array layout), catches up
through the replay socket, and checks that the index was cleared and that the sequence numbers
started again.

Usage: kv_events_router.py KVVM_BINARY MODEL_DIR. Exit 0 when every check held.
"""

import ctypes
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgpack
import zmq

_xxhash = ctypes.CDLL("libxxhash.so.0")
_xxhash.XXH3_64bits.restype = ctypes.c_uint64
_xxhash.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3_64(data):
    return _xxhash.XXH3_64bits(data, len(data))


def root_hash(salt):
    return xxh3_64(salt.to_bytes(8, "little"))


def block_hash(parent, ids):
    return xxh3_64(parent.to_bytes(8, "little") + b"".join(i.to_bytes(4, "little") for i in ids))


# llama-tiny's KV on the host's page granule: 2,048 bytes a token in 4,096-byte windows, so a
# cache hit comes in multiples of 2 tokens (kvvm serve refuses a block_size it cannot end on).
HIT_UNIT_TOKENS = 2


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def free_port(taken=()):
    # Below the kernel's ephemeral range (32768 on): a port there may be taken by any
    # outgoing connection on the machine between this check and the server's bind.
    while True:
        port = random.randrange(20000, 32000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue


class Router:
    """The index of one replica, from its events."""

    def __init__(self, salts, layout):
        self.salts = salts
        self.layout = layout  # "array" or "map": what the replica publishes now
        self.blocks = {}  # hash -> (parent, token ids)
        self.block_size = 0
        self.last_seq = -1
        self.cleared = 0
        self.removed = 0
        self.batches = 0

    def event_fields(self, event):
        if self.layout == "map":
            check(isinstance(event, dict), "a map-layout event that is not a map: %r" % (event,))
            return event["type"], event
        check(isinstance(event, list), "an array-layout event that is not an array: %r" % (event,))
        tag = event[0]
        names = {
            "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                            "lora_id", "medium", "lora_name"],
            "BlockRemoved": ["block_hashes", "medium"],
            "AllBlocksCleared": [],
        }[tag]
        check(len(event) == len(names) + 1, "%s with %d fields" % (tag, len(event) - 1))
        return tag, dict(zip(names, event[1:]))

    def apply(self, seq, payload):
        batch = msgpack.unpackb(payload, raw=False)
        check(isinstance(batch, list) and len(batch) == 3, "a batch that is not [ts, events, rank]")
        ts, events, rank = batch
        check(isinstance(ts, float) and abs(ts - time.time()) < 600, "batch time %r" % (ts,))
        check(rank == 0, "data_parallel_rank %r" % (rank,))
        self.batches += 1
        self.last_seq = seq
        for event in events:
            tag, f = self.event_fields(event)
            if tag == "AllBlocksCleared":
                self.blocks.clear()
                self.cleared += 1
            elif tag == "BlockRemoved":
                check(f["medium"] == "CPU", "medium %r" % (f["medium"],))
                for h in f["block_hashes"]:
                    check(h in self.blocks, "removed block %d was not stored" % h)
                    del self.blocks[h]
                    self.removed += 1
            elif tag == "BlockStored":
                check(f["medium"] == "CPU" and f["lora_id"] is None, "BlockStored %r" % (f,))
                size = f["block_size"]
                self.block_size = size
                ids = f["token_ids"]
                hashes = f["block_hashes"]
                check(len(ids) == size * len(hashes), "token_ids of %d blocks" % len(hashes))
                parent = f["parent_block_hash"]
                for i, h in enumerate(hashes):
                    block = ids[i * size:(i + 1) * size]
                    if parent is None:
                        check(any(h == block_hash(root_hash(s), block) for s in self.salts),
                              "block 0's hash is no tenant's")
                    else:
                        check(parent in self.blocks, "stored under a parent not held")
                        check(h == block_hash(parent, block), "a hash the scheme does not give")
                    check(h not in self.blocks, "block %d stored twice" % h)
                    self.blocks[h] = (parent, block)
                    parent = h
            else:
                raise Failure("unknown event %r" % (tag,))

    def predicted_hit(self, prompt, salt):
        if self.block_size == 0:
            return 0
        h = root_hash(salt)
        hit = 0
        while hit + self.block_size <= len(prompt) - 1:
            h = block_hash(h, prompt[hit:hit + self.block_size])
            if h not in self.blocks:
                break
            hit += self.block_size
        return hit


class Subscriber:
    def __init__(self, router, pub_port, replay_port, topic):
        self.router = router
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect("tcp://127.0.0.1:%d" % pub_port)
        self.replay_port = replay_port
        self.topic = topic
        self.replays = 0

    def replay_from(self, start):
        # A DEALER that sends the empty delimiter a REQ would: a REQ socket takes one reply
        # per request and drops the rest of the stream.
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect("tcp://127.0.0.1:%d" % self.replay_port)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            check(dealer.poll(5000), "no replay answer")
            empty, seq_bytes, payload = dealer.recv_multipart()
            check(empty == b"", "a replay answer without its delimiter")
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                check(payload == b"", "an end marker with a payload")
                break
            got.append((seq, payload))
        dealer.close()
        self.replays += 1
        return got

    def catch_up(self, start):
        for seq, payload in self.replay_from(start):
            if seq > self.router.last_seq:
                self.router.apply(seq, payload)

    def drain(self, quiet_ms=150):
        """Applies every batch that arrives until none has for quiet_ms."""
        while self.sub.poll(quiet_ms):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            check(topic == self.topic.encode(), "topic %r" % topic)
            seq = int.from_bytes(seq_bytes, "big")
            if seq <= self.router.last_seq:
                # Numbers start again: a new process. What it sent before we saw it comes
                # from its replay socket (its first batch clears the index).
                self.router.last_seq = -1
                self.catch_up(0)
                continue
            if seq > self.router.last_seq + 1:
                self.catch_up(self.router.last_seq + 1)
            if seq > self.router.last_seq:
                self.router.apply(seq, payload)


def start_server(kvvm, model, keys, pub_port, replay_port, layout, block_size):
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:%d" % pub_port,
        "replay_endpoint": "tcp://*:%d" % replay_port,
        "topic": "kvvm",
        "buffer_steps": 1000,
        "encoding": layout,
    }
    if block_size:
        config["block_size"] = block_size
    process = subprocess.Popen(
        [kvvm, "serve", "--model", model, "--port", "0", "--backend", "cpu", "--api-keys", keys,
         "--kv-budget", os.environ.get("KV_EVENTS_BUDGET", "384KiB"), "--max-context", "128",
         "--max-running", "2", "--http-threads", "4", "--kv-events-config", json.dumps(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        match = re.search(r"on http://127\.0\.0\.1:(\d+) \(", line)
        if match:
            return process, int(match.group(1))
    process.kill()
    errors = process.stderr.read()
    process.wait()
    if "Address already in use" in errors:
        return None, None
    raise Failure("kvvm serve did not start: " + errors)


def stop_server(process):
    process.send_signal(signal.SIGTERM)
    check(process.wait(60) == 0, "kvvm serve exited %r" % process.returncode)


def complete(port, key, prompt, max_tokens):
    body = json.dumps({"model": "llama-tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    request = urllib.request.Request(
        "http://127.0.0.1:%d/v1/completions" % port, data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["usage"]["prompt_tokens_details"]["cached_tokens"]


def prompts(rng, tenant):
    system = random.Random(100 + tenant).sample(range(1, 500), 24)
    prompt = list(system)
    if rng.random() < 0.5:
        prompt += random.Random(200 + tenant * 10 + rng.randrange(3)).sample(range(1, 500), 20)
    return prompt + [rng.randrange(1, 500) for _ in range(rng.randrange(8, 48))]


def run_requests(router, subscriber, port, keys, rng, count, stats, unit):
    for i in range(count):
        tenant = rng.choice([1, 2])
        prompt = prompts(rng, tenant)
        subscriber.drain()
        predicted = router.predicted_hit(prompt, tenant)
        cached = complete(port, keys[tenant], prompt, rng.randrange(1, 4))
        # Blocks of the hit unit: exact. Larger blocks: kvvm may find up to a block less one
        # unit more, where the prompt leaves the cached chain inside a block; never less.
        exact = router.block_size in (0, unit)
        agrees = cached == predicted if exact else predicted <= cached < predicted + \
            router.block_size
        check(agrees, "request %d of tenant %d (%d tokens): kvvm found %d tokens cached, the "
              "router predicted %d (blocks of %d)" % (i, tenant, len(prompt), cached, predicted,
                                                     router.block_size))
        stats["exact" if exact else "bounded"] += 1
        stats["hits"] += cached
        stats["requests"] += 1


def main():
    kvvm, model = sys.argv[1], sys.argv[2]
    keys = {1: "kv-events-key-one", 2: "kv-events-key-two"}
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write("%s alice\n%s bob\n" % (keys[1], keys[2]))
        key_file = f.name
    pub_port = free_port()
    replay_port = free_port([pub_port])
    router = Router(salts=[1, 2], layout="array")
    subscriber = Subscriber(router, pub_port, replay_port, "kvvm")
    rng = random.Random(5)
    stats = {"hits": 0, "requests": 0, "exact": 0, "bounded": 0}
    unit = HIT_UNIT_TOKENS
    process = None
    try:
        for _ in range(5):
            process, port = start_server(kvvm, model, key_file, pub_port, replay_port, "array",
                                         unit)
            if process is not None:
                break
            pub_port = free_port()
            replay_port = free_port([pub_port])
            subscriber = Subscriber(router, pub_port, replay_port, "kvvm")
        check(process is not None, "no free ports")
        # The first batch (AllBlocksCleared) went before this subscriber was there.
        subscriber.catch_up(0)
        check(router.cleared == 1, "no AllBlocksCleared at start")
        run_requests(router, subscriber, port, keys, rng, 40, stats, unit)
        check(router.removed > 0, "the budget never made the cache evict")
        check(len(router.blocks) > 0, "no block held")
        held_before = len(router.blocks)

        stop_server(process)
        process = None
        subscriber.drain(500)
        check(router.cleared == 2 and not router.blocks,
              "a stopped server's cache did not clear the index")

        router.layout = "map"
        for _ in range(5):  # the same ports: the subscriber stays connected across the restart
            process, port = start_server(kvvm, model, key_file, pub_port, replay_port, "map", 0)
            if process is not None:
                break
            time.sleep(1)
        check(process is not None, "the restarted server found its ports taken")
        # The subscriber's socket reconnects on its own (every 100 ms); a batch sent before it
        # has is dropped by the PUB socket, and the replay socket brings it back once a later
        # batch shows the numbers starting again.
        time.sleep(1.0)
        complete_first = prompts(rng, 1)
        # Until the first request's events arrive the subscriber may not see the new process.
        cached = complete(port, keys[1], complete_first, 1)
        check(cached == 0, "a restarted server found %d tokens cached" % cached)
        subscriber.drain(500)
        check(router.last_seq >= 0 and router.cleared == 3,
              "the restarted server's batches were not replayed from 0 (last seq %d, %d clears)"
              % (router.last_seq, router.cleared))
        run_requests(router, subscriber, port, keys, rng, 30, stats, unit)
        check(router.block_size == 16, "default block of %d tokens" % router.block_size)
        stop_server(process)
        process = None
        print("kv_events_router: %d requests agreed (%d exactly with blocks of %d tokens, %d "
              "within a block with blocks of 16; %d cached tokens), %d batches, %d blocks "
              "removed, %d clears, %d replays, %d blocks held before the restart" %
              (stats["requests"], stats["exact"], unit, stats["bounded"], stats["hits"],
               router.batches, router.removed, router.cleared, subscriber.replays, held_before))
        check(stats["hits"] > 0, "no request hit the cache")
        return 0
    except Failure as failure:
        print("kv_events_router: FAILED: %s" % failure)
        return 1
    finally:
        if process is not None:
            process.kill()
            process.wait()
        os.unlink(key_file)


if __name__ == "__main__":
    sys.exit(main())
