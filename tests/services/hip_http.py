#!/usr/bin/python3
"""A service the scheduler was never tuned on, for the VM tests (tests/tests/emu_arrival.rs):
Python's own threaded HTTP server, HIP called through ctypes, and no code of the project's.

  hip_http.py CPU_MS KERNELS ELEMENTS

`POST` (any path, a JSON body): the CPU phase first, CPU_MS of hashing the body over and over
(a tokenizer's work, in the interpreter), then KERNELS hipMemsetD32Async of ELEMENTS 32-bit words
on one stream (HIP's own fill kernels) and hipStreamSynchronize; answered with a JSON line.
`GET /health`: "ok" at once, no GPU work. It prints {"pid", "port", "warmup_ms"} once it listens,
after one warm-up request's GPU work (its queue exists before any scheduler looks), and runs
until killed.
"""
import ctypes
import hashlib
import http.server
import json
import os
import sys
import threading
import time

HIP = ctypes.CDLL("libamdhip64.so.5")


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: hipError_t {rc}")


def main():
    cpu_ms, kernels, elements = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    check(HIP.hipSetDevice(0), "hipSetDevice")
    buf, stream = ctypes.c_void_p(), ctypes.c_void_p()
    check(HIP.hipMalloc(ctypes.byref(buf), ctypes.c_size_t(elements * 4)), "hipMalloc")
    check(HIP.hipStreamCreate(ctypes.byref(stream)), "hipStreamCreate")
    gpu = threading.Lock()

    def gpu_work(value):
        with gpu:
            for k in range(kernels):
                check(HIP.hipMemsetD32Async(buf, ctypes.c_int(value + k), ctypes.c_size_t(elements), stream),
                      "hipMemsetD32Async")
            check(HIP.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def cpu_phase(body):
        deadline = time.monotonic() + cpu_ms / 1e3
        digest = body
        while time.monotonic() < deadline:
            digest = hashlib.sha256(digest).digest()
        return digest

    counts = {"requests": 0, "health": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, code, body):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            prompt = json.loads(body or b"{}")
            digest = cpu_phase(body)
            gpu_work(digest[0])
            counts["requests"] += 1
            self.answer(200, json.dumps({"id": prompt.get("id"), "kernels": kernels}).encode())

        def do_GET(self):
            if self.path == "/health":
                counts["health"] += 1
                self.answer(200, b'"ok"')
            elif self.path == "/stats":
                self.answer(200, json.dumps(counts).encode())
            else:
                self.answer(404, b"{}")

        def log_message(self, *args):
            pass

    start = time.monotonic()
    gpu_work(0)
    warmup_ms = (time.monotonic() - start) * 1e3
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(json.dumps({"pid": os.getpid(), "port": server.server_address[1], "warmup_ms": warmup_ms}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
