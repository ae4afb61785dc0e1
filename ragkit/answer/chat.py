"""A chat session: one model and its KV cache kept alive across questions.

Follow-up questions on the same documents share the prompt up to the question (the
documents go in whole, in a stable order), so the generator only prefills the new
question. With the in-process llama backend that reuse happens inside the one `Llama`
object; `ragkit.answer.ask.ask` loads generators through a cache, so it holds for any sequence
of asks in one process. A session adds:

- the generator loaded once, up front;
- `state_dir`: the llama state (KV cache and its token ids) saved to a file keyed by the
  sha256 of the prompt prefix (and the settings that shape the cache), and restored in a
  new process before the first question, which then skips the prefill of the documents.
  llama-cpp-python's own LlamaRAMCache/LlamaDiskCache default to 2 GiB and drop any
  larger state, and its `LlamaState` carries the logits of up to n_batch rows (311 MB for
  a 152K vocabulary) that generation does not use, so the file is written here, as a
  plain `.npz` (no pickle) of the token ids and llama.cpp's own state bytes.

    from ragkit.answer.chat import ChatSession
    chat = ChatSession(settings, docs=["nda.pdf"])
    for q in questions:
        r = chat.ask(q)
        print(r.answer, r.generation.cached_tokens, r.generation.ttft_s)
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Callable

from ragkit.answer.ask import AskResult, answer_without_generating, finish
from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.retrieve import retrieve
from ragkit.retrieve.prompt import Prompt
from ragkit.session import Session

STATE_VERSION = 1


class ChatSession:
    def __init__(self, session: Session | Settings, docs: list[str] | None = None, *, state_dir: Path | None = None):
        self.session = Session.of(session)
        self.settings = self.session.settings
        self.docs = list(docs or [])
        self.generator = self.session.generator
        self.state_dir = Path(state_dir) if state_dir is not None else None
        if self.state_dir is not None:
            if not hasattr(self.generator, "llm") or not hasattr(self.generator, "cached_prefix"):
                raise UsageError("--state-dir works with the in-process llama_cpp backend only",
                                 hint="an OpenAI-compatible engine keeps its own cache")
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot create the state folder {self.state_dir}: {exc.strerror}") from None

    # ------------------------------------------------------------ asking

    def ask(self, question: str, *, on_text: Callable[[str], None] | None = None) -> AskResult:
        """Like `ragkit.answer.ask.ask` (the same three outcomes, the same quoted answers), on the
        session's generator, with the state restored or saved around the generation when
        `state_dir` is set."""
        t0 = time.perf_counter()
        r = retrieve(question, self.session, self.docs, generator=self.generator)
        prompt = r.prompt
        result = AskResult.from_retrieval(r)
        if answer_without_generating(result, r, t0, self.session, on_text):
            return result
        restored = self.restore_state(prompt) if self.state_dir is not None else None
        if restored is not None:
            result.timings["state_load_s"] = restored
        gen = self.generator.generate(prompt.ids, max_tokens=self.settings.generator.max_tokens, on_text=on_text)
        finish(result, gen, t0, self.session)
        if self.state_dir is not None:
            saved = self.save_state(prompt)
            if saved is not None:
                result.timings["state_save_s"] = saved
            result.timings["total_s"] = time.perf_counter() - t0
        return result

    # ------------------------------------------------------------ saved state

    def state_path(self, prompt: Prompt) -> Path:
        cfg = self.settings.generator
        gen = self.generator
        h = hashlib.sha256()
        model = Path(getattr(gen, "model_path", cfg.model))
        try:
            size = model.stat().st_size
        except OSError:
            size = -1
        # what shapes the KV cache: the model, the context and cache types, the prefix ids
        h.update(f"v{STATE_VERSION}|{model.name}|{size}|{cfg.n_ctx}|{cfg.type_k}|{cfg.type_v}|{cfg.flash_attn}|".encode())
        import numpy as np

        h.update(np.asarray(prompt.ids[: prompt.prefix_tokens], dtype=np.int32).tobytes())
        return self.state_dir / f"{h.hexdigest()}.npz"

    def restore_state(self, prompt: Prompt) -> float | None:
        """Load the saved state for this prompt's prefix, unless the live cache already
        holds it. Returns the seconds it took, or None when nothing was loaded."""
        import numpy as np
        from llama_cpp import LlamaState

        gen = self.generator
        if prompt.prefix_tokens <= 0 or gen.cached_prefix(prompt.ids) >= prompt.prefix_tokens:
            return None
        path = self.state_path(prompt)
        if not path.is_file():
            return None
        t0 = time.perf_counter()
        llm = gen.llm
        try:
            with np.load(path, allow_pickle=False) as z:
                ids = z["input_ids"].astype(np.intc)
                blob = z["llama_state"].tobytes()
                seed = int(z["seed"])
            n = len(ids)
            if n > llm.input_ids.shape[0] or list(ids[: prompt.prefix_tokens]) != list(prompt.ids[: prompt.prefix_tokens]):
                raise ValueError("the saved tokens do not match this prompt")
            input_ids = np.zeros(llm.input_ids.shape, dtype=np.intc)
            input_ids[:n] = ids
            # logits are not needed to continue (sampling decodes the last token again);
            # one zero row broadcasts over the rows load_state clears
            llm.load_state(LlamaState(input_ids=input_ids, scores=np.zeros((1, llm.n_vocab()), dtype=np.single),
                                      n_tokens=n, llama_state=blob, llama_state_size=len(blob), seed=seed))
        except Exception as exc:  # a stale or damaged file costs a prefill, never the answer
            sys.stderr.write(f"ragkit chat: ignoring saved state {path.name}: {exc}\n")
            llm.reset()
            return None
        return time.perf_counter() - t0

    def save_state(self, prompt: Prompt) -> float | None:
        """Write the live state for this prompt's prefix, once per prefix."""
        import ctypes

        import llama_cpp
        import numpy as np

        path = self.state_path(prompt)
        if prompt.prefix_tokens <= 0 or path.is_file():
            return None
        t0 = time.perf_counter()
        llm = self.generator.llm
        # Llama.save_state() would also copy up to n_batch rows of logits (311 MB here)
        ctx = llm._ctx.ctx
        size = int(llama_cpp.llama_state_get_size(ctx))
        buf = (ctypes.c_uint8 * size)()
        n_bytes = int(llama_cpp.llama_state_get_data(ctx, buf, size))
        if n_bytes > size:
            return None
        blob = np.frombuffer(buf, dtype=np.uint8, count=n_bytes)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, input_ids=np.asarray(llm.input_ids[: llm.n_tokens], dtype=np.int32),
                         llama_state=blob, seed=np.int64(getattr(llm, "_seed", self.settings.generator.seed)))
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            sys.stderr.write(f"ragkit chat: could not save the state to {path}: {exc.strerror}\n")
            return None
        return time.perf_counter() - t0
