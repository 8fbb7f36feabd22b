"""A vLLM engine's replica (engines/vllm.py starts one per `evaluate.vllm.data_parallel_size`): a Ray actor
holding one `vllm.LLM` on its own `tensor_parallel_size` GPUs (Ray sets its `CUDA_VISIBLE_DEVICES`), whose `serve`
streams back one message per finished generation, and vLLM's log lines as they are written. It runs in the vLLM
environment (.venv-vllm) and imports vLLM and the boxed-answer rule alone (engines/__init__.py and base.py, which
Python imports first, import no torch or transformers).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from meaningless_tokens.grading import has_complete_box


class VllmReplica:
    """One engine. vLLM logs to the process's stdout and stderr (and its engine-core process inherits them): both
    go to a file of this replica's, whose new lines `serve` sends along with the generations, so the stage prints
    them as a worker process's log, on whichever node the replica runs."""

    def __init__(self, env: dict):
        os.environ.update(env)  # before vLLM is imported: VLLM_BATCH_INVARIANT is read at import
        fd, self.log_path = tempfile.mkstemp(prefix="mless-vllm-", suffix=".log")
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(fd, 1), os.dup2(fd, 2)
        os.close(fd)
        self.log = open(self.log_path, "rb")

    def _new_log(self) -> str:
        sys.stdout.flush(), sys.stderr.flush()
        return self.log.read().decode("utf-8", errors="replace")

    def serve(self, request: dict):
        """Generate every job of `request`: yields {"started": s}, then {"id", "token_ids"} per finished job, with
        {"log": text} whenever vLLM wrote more."""
        try:
            yield from self._serve(request)
        except Exception as e:  # noqa: BLE001 - vLLM's failure with the log that explains it
            raise RuntimeError(f"{type(e).__name__}: {e}\n{self._new_log()[-4000:]}") from None
        log = self._new_log()
        if log:
            yield {"log": log}

    def _serve(self, request: dict):
        t0 = time.perf_counter()
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.llm = llm = LLM(**request["engine"])
        engine, tokenizer = llm.llm_engine, llm.get_tokenizer()
        started = time.perf_counter() - t0
        print(f"vLLM engine started in {started:.1f} s", file=sys.stderr)
        yield {"log": self._new_log()}
        yield {"started": round(started, 3)}
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
            log = self._new_log()
            if log:
                yield {"log": log}
            for d in done:
                yield {"id": d, "token_ids": produced.pop(d)}

    def stop(self) -> None:
        """Every process this replica started (vLLM's engine core and workers) killed; then the actor may go."""
        import psutil

        me = psutil.Process()
        children = me.children(recursive=True)
        for p in children:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(children, timeout=20)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
