"""Multi-digit arithmetic: a verifiable toy task generated from a seed.

Problems are ``a OP b`` with ``a, b`` in ``[0, 10**digits)``. Whether a problem
belongs to the held-out split is a pure function of the problem (a hash of its
text), so the split is disjoint from training by construction and the same
for every seed; the seed only decides the order in which problems are drawn.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterator
from typing import Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Range, check_arguments, check_rules, checked_by
from rlax.core.errors import BadSetting
from rlax.core.types import Prompt

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
ALPHABET = "0123456789+-*="


def is_held_out(problem: str, eval_fraction: float) -> bool:
    """True if ``problem`` (e.g. "12+34") belongs to the held-out split."""
    digest = hashlib.blake2b(problem.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10_000 < eval_fraction * 10_000


def _problems(
    *,
    digits: int = 2,
    operations: str = "+",
    eval_fraction: float = 0.1,
    num_eval: int = 200,
    template: str = "{problem}=",
    **_,
) -> None:
    """BadSetting: operations not from '+-*', more held-out problems than the space
    holds, or a template that does not show the problem."""
    if not operations or set(operations) - set(_OPS):
        raise BadSetting("operations", f"a string of '+-*', got {operations!r}")
    space = len(operations) * 10 ** (2 * min(digits, 50))
    if 0 < eval_fraction < 1 and num_eval > space * eval_fraction / 2:
        raise BadSetting(
            "num_eval",
            f"{num_eval} is too many for ~{int(space * eval_fraction)} held-out problems",
        )
    try:
        shown = template.format(problem="1+2")
    except (KeyError, IndexError, ValueError) as err:
        raise BadSetting("template", f"{template!r} must use only {{problem}}: {err!r}") from None
    if "1+2" not in shown:
        raise BadSetting("template", f"{template!r} does not show {{problem}}")


@checked_by(_problems)
class ArithmeticTask:
    """Prompts like ``"123+45="``; the answer is the integer result as text.

    Args:
      digits: largest operand has this many digits.
      operations: which of ``+ - *`` to draw from.
      eval_fraction: share of the problem space held out for evaluation.
      num_eval: how many held-out problems ``prompts("eval")`` yields.
      template: the text shown to the model, with ``{problem}`` standing for
        the expression (``"{problem}="``: ``"12+5="``; an instruct model does
        better with a question, ``"What is {problem}?"``).
    """

    alphabet = ALPHABET
    default_reward = "arithmetic"

    def __init__(
        self,
        *,
        digits: Annotated[int, AtLeast(1)] = 2,
        operations: str = "+",
        eval_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.1,
        num_eval: Annotated[int, AtLeast(1)] = 200,
        template: str = "{problem}=",
    ):
        check_arguments(ArithmeticTask.__init__, locals(), owner="tasks.arithmetic")
        check_rules(
            ArithmeticTask,
            "tasks.arithmetic",
            digits=digits,
            operations=operations,
            eval_fraction=eval_fraction,
            num_eval=num_eval,
            template=template,
        )
        self.template = template
        self.digits = digits
        self.operations = operations
        self.eval_fraction = eval_fraction
        self.num_eval = num_eval

    def _draw(self, rng: np.random.Generator) -> tuple[int, str, int]:
        hi = 10**self.digits
        a, b = (int(x) for x in rng.integers(0, hi, size=2))
        return a, self.operations[int(rng.integers(len(self.operations)))], b

    def make_prompt(self, a: int, op: str, b: int, tokenizer, split: str) -> Prompt:
        problem = f"{a}{op}{b}"
        text = self.template.format(problem=problem)
        return Prompt(
            id=problem,
            text=text,
            tokens=tokenizer.encode(text, bos=True),
            answer=str(_OPS[op](a, b)),
            metadata={"split": split},
        )

    def prompts(self, split: str, *, tokenizer, seed: int) -> Iterator[Prompt]:
        """``"train"``: an endless stream of training problems in seeded order.
        ``"eval"``: ``num_eval`` distinct held-out problems, always the same ones.
        """
        if split not in ("train", "eval"):
            raise ValueError(f"arithmetic task: unknown split {split!r} (use 'train' or 'eval')")
        held_out = split == "eval"
        # The eval set must not depend on the run's seed: fixed generator.
        rng = np.random.default_rng(seed if split == "train" else 0x5EED)
        seen: set[str] = set()
        while not held_out or len(seen) < self.num_eval:
            a, op, b = self._draw(rng)
            problem = f"{a}{op}{b}"
            if is_held_out(problem, self.eval_fraction) != held_out:
                continue
            if held_out:
                if problem in seen:
                    continue
                seen.add(problem)
            yield self.make_prompt(a, op, b, tokenizer, split)


@hookimpl
def rlax_register_tasks():
    return {"arithmetic": ArithmeticTask}
