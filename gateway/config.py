"""Gateway settings."""

from __future__ import annotations

import dataclasses

from specdec.runtime.config import option


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """Gateway"""

    model: str = option("", "tokenizer directory: the target model's")
    verifier: str = option("localhost:50052", "verifier service(s): HOST:PORT, a list A:PORT,B:PORT, or "
                                              "dns:///NAME:PORT (every address of NAME, looked up every "
                                              "--peer-check-s); each request goes to the usable one with the "
                                              "fewest open requests (gateway/verifier_pool.py)")
    max_resumes: int = option(2, "a request whose verifier goes away mid-stream continues on another one, "
                                 "at most this many times (0: fails instead)")
    draft: str = option("", "draft service HOST:PORT, checked at start-up for tokenizer compatibility")
    num_speculative_tokens: int = option(-1, "default k for requests that leave it unset (-1: the verifier's default)")
    default_max_tokens: int = option(256, "max_tokens for requests that leave it unset")
    max_prompt_tokens: int = option(0, "longest prompt accepted (0: the model's context)")
    peer_wait_s: float = option(60.0, "at start-up, wait this long for a verifier to answer")
    peer_check_s: float = option(5.0, "while serving, check each verifier (answering, SERVING, same tokenizer and model) "
                                      "this often and at every reconnect or health change; an unusable one takes no "
                                      "requests, and health is NOT_SERVING while none is usable")
    prepare_workers: int = option(2, "threads that tokenize prompts, render chat templates and scan HTTP bodies; "
                                     "requests beyond them wait, so concurrent large inputs cannot all be "
                                     "worked on (and held) at once")
    request_timeout_s: float = option(600.0, "deadline of one request to the verifier")
    api_keys: str = option("", "comma-separated API keys; when set, calls need `authorization: Bearer KEY`")
    trace_prompts: bool = option(False, "record prompt text in spans (off: prompts stay out of traces)")
    http_port: int = option(8000, "OpenAI-compatible HTTP API port, on --host with the same TLS flags "
                                  "(0 picks a free one and logs it; -1 turns it off)")
    http_header_timeout_s: float = option(10.0, "an HTTP connection must send a whole request head (line and "
                                                 "headers) within this long of opening or of its last response, "
                                                 "or it is closed: idle and slow-header sockets cannot pile up")
    http_keep_alive_s: float = option(5.0, "an idle HTTP keep-alive connection is closed after this long")
    http_max_connections: int = option(0, "most HTTP connections open at once; a connection beyond it is closed "
                                          "as it arrives (0: a quarter of the process's open-file limit, leaving "
                                          "the rest to gRPC and the models)")
    served_model_name: str = option("", "the model name of the HTTP API: /v1/models lists it and requests must "
                                        "name it (default: the model the verifier reports, its --model path, as vLLM does)")
