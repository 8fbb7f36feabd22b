"""A vLLM engine's worker process (engines/vllm.py starts it): `python -m meaningless_tokens.engines.vllm_worker FD`,
one `vllm.LLM`, the request as JSON on stdin, one JSON line per finished generation to the pipe FD. It runs in the
vLLM environment (.venv-vllm) and imports vLLM and the boxed-answer rule alone (engines/__init__.py and base.py, which
Python imports first, import no torch or transformers).
"""

from __future__ import annotations

import json
import os
import sys
import time

from meaningless_tokens.grading import has_complete_box


def serve(request: dict, out) -> None:
    """One engine: generate every job of `request`, writing each finished one to `out` as a JSON line."""
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm = LLM(**request["engine"])
    engine, tokenizer = llm.llm_engine, llm.get_tokenizer()
    started = time.perf_counter() - t0
    print(f"vLLM engine started in {started:.1f} s", file=sys.stderr)
    out.write(json.dumps({"started": round(started, 3)}) + "\n")
    out.flush()
    sampling = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], seed=request["seed"],
                              stop_token_ids=request["stop_token_ids"], detokenize=False,
                              skip_special_tokens=True, output_kind=RequestOutputKind.DELTA)
    produced: dict[str, list[int]] = {}
    for job in request["jobs"]:
        job_id, ids = job[0], job[1]
        produced[job_id] = []
        params = sampling if len(job) < 3 else SamplingParams(
            temperature=job[2]["temperature"], top_p=job[2]["top_p"], top_k=job[2]["top_k"],
            max_tokens=job[2]["max_tokens"], seed=job[2]["seed"], stop_token_ids=request["stop_token_ids"],
            detokenize=False, skip_special_tokens=True, output_kind=RequestOutputKind.DELTA)
        engine.add_request(job_id, {"prompt_token_ids": ids}, params)
    boxed = request["stop_at_boxed"]
    while engine.has_unfinished_requests():
        done, boxed_now = [], []
        for o in engine.step():
            new = list(o.outputs[0].token_ids) if o.outputs else []
            produced[o.request_id].extend(new)
            if o.finished:
                done.append(o.request_id)
            # the text so far is decoded only when a new token wrote a '}' (a box can close only then)
            elif boxed and "}" in tokenizer.decode(new, skip_special_tokens=True) and \
                    has_complete_box(tokenizer.decode(produced[o.request_id], skip_special_tokens=True)):
                boxed_now.append(o.request_id)
        if boxed_now:
            engine.abort_request(boxed_now)
        done += boxed_now
        for d in done:
            out.write(json.dumps({"id": d, "token_ids": produced.pop(d)}) + "\n")
            out.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with os.fdopen(int(argv[0]), "w", encoding="utf-8") as out:
        os.set_inheritable(out.fileno(), False)
        serve(json.loads(sys.stdin.read()), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
