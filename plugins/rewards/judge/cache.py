"""The judgements ``rewards.judge`` already has: never ask the grader the same thing twice.

A judgement is keyed by the grader's model, the rubric (with its system
text), the prompt, the completion and the reference answer; the value kept
is the grader's whole answer, so an unparseable one is not asked again
either (it is read again, and is again an error). Failed requests (timeouts,
transport errors, refusals) are not kept. With a ``path`` the cache is also
a JSON-lines file, read once when first used and appended to per new
judgement, so a restarted worker (or another process) does not ask again
what is on disk; each line is ``{"key": sha256 hex, "answer": text}``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import threading
from typing import Any

__all__ = ["JudgeCache", "judgement_key"]


def judgement_key(model: str, rubric: str, prompt: str, completion: str, answer: Any) -> str:
    """The cache key: sha256 of the five, as one JSON array (a non-text answer as JSON)."""
    fields = [model, rubric, prompt, completion, answer]
    blob = json.dumps(fields, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgeCache:
    """Judgements in memory, and in the JSON-lines file ``path`` if given ("": memory only).

    Thread-safe; picklable (the lock is made again, the file read again).
    """

    def __init__(self, path: str = "") -> None:
        self.path = path
        self._answers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._loaded = not path

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "answers": dict(self._answers)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]
        self._answers.update(state["answers"])

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: str) -> str | None:
        with self._lock:
            self._load()
            return self._answers.get(key)

    def put(self, key: str, answer: str) -> None:
        with self._lock:
            self._load()
            if key in self._answers:
                return
            self._answers[key] = answer
            if self.path:
                line = json.dumps({"key": key, "answer": answer}, ensure_ascii=False)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(line + "\n")

    def _load(self) -> None:
        """Reads the file once; a torn last line (a process killed mid-write) is skipped."""
        if self._loaded:
            return
        self._loaded = True
        path = pathlib.Path(self.path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                self._answers.setdefault(str(row["key"]), str(row["answer"]))
            except (ValueError, KeyError, TypeError):
                continue
