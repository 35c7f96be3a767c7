"""The labelled table of the math verifier: (completion, reference, correct?).

Policy (what "correct" means here, decided before the verifier was run):

- **The last box counts.** The answer is the argument of the last complete
  ``\\boxed{}`` / ``\\fbox{}``; else the last ``#### x``; else the last
  "the answer is x" / "final answer: x". Only a text with none of these
  markers is judged by its last number (or its last ``$...$`` formula, when
  that comes later: ``So $x=\\frac{1}{2}$.`` answers 1/2, not 2). A marker whose
  answer is missing or never closes (``\\boxed{\\frac{1}{}``) is no answer: the
  last number is not a second chance.
- **Exact fractions vs decimals.** Numbers are equal only as exact
  rationals: ``0.5`` is ``\\frac{1}{2}``, ``0.333`` is not ``\\frac{1}{3}``.
  Powers and scientific notation are numbers (``1e308`` is ``10^{308}``).
  A percentage equals its number and its fraction (``25\\%`` is 25 and 0.25).
- **Units are part of the answer** (issue 54, ``math/units.py``). Two
  quantities are equal only if one converts to the other exactly (length,
  time, mass, angle: ``5 km`` is ``5000 m``, never ``5 m``; different
  dimensions never); unknown units are compared as text (``15 apples`` is not
  ``15 oranges``). A bare number against a quantity is compared with the
  quantity's number (``18 dollars`` answers 18, ``45`` answers
  ``45^\\circ``): the question named the unit. A word that changes the value
  or joins another answer is no unit (``5 thousand``, ``3 million``, ``5
  pi``, ``2 or 3``), and a bare letter is a variable (``5 x``; a one-letter
  unit needs ``\\text{}``: ``12\\text{ m}``).
- **Degrees and radians** are one dimension: ``30^\\circ`` is ``\\frac{\\pi}{6}``.
- **Spellings that mean one thing** (``math/forms.py``): infinity however
  spelled (``∞``, ``infinity``, ``oo``), its sign kept; redundant group
  braces (``{{12}}``), never escaped set braces; mixed numbers (``2 1/4``);
  integer power towers evaluated exactly up to 4096 bits (``2^{2^{3}}`` is
  256, read from the top), refused above; matrices and vectors as LaTeX
  environments or nested lists, equal entry by entry (a one-column matrix is
  the tuple of its entries).
- **Words are text**, compared case-insensitively, whatever their length:
  ``no`` is not ``on`` and ``grown`` is not ``wrong``.
- **Repeating decimals are exact.** ``0.\\overline{3}``, ``0.\\bar{3}``,
  ``0.(3)`` and ``0.\\dot{3}`` are 1/3; ``0.1\\overline{6}`` is 1/6; dots over
  the first and last digit mark a longer block (``0.\\dot{1}4285\\dot{7}`` is
  1/7). ``0.\\overline{9}`` is 1, and a truncation (``0.333``) is still not 1/3.
  In prose the block belongs to its number: the last number of ``x = 0.(3)``
  is 1/3, not 3.
- **A choice is a capital letter on the last "Answer:" line.** ``Answer: (B)``,
  ``Answer: B``, ``**Answer:** B``, ``Answer: (B) 42`` (the option's text may
  follow a label) answer B, unless a box or ``####`` outranks them or a later
  "the answer is" follows. A capital letter in prose is no choice
  (``Answer: A pair of ...``, ``Option A looks right``), nor is a lower-case
  ``Answer: b``. Letters compare as labels: ``(B)`` is ``B`` (and a boxed
  ``b``), never ``2``.
- **i standing alone is the imaginary unit** (not inside a word, a command, a
  subscript or a sum): ``i^2`` is -1, ``2i`` is ``2 i``, ``(1+i)^2`` is ``2i``;
  real answers are judged as before.
- **A numeral's subscript is its base** (2 to 36; digits, then A-Z):
  ``12_8`` and ``12_{8}`` are 10, ``1010_2`` is 10, so ``12_8`` is not 12; a
  digit the base lacks (``19_8``) is wrong. A reference in base b asks for
  base b: the prediction's bare digits are read in it (``12`` answers
  ``12_8``, ``10`` does not, ``10_{10}`` does). A subscripted number inside
  an expression (``12_8+1``) equals only its own spelling.
- Everything else is equal when it is mathematically the same expression,
  interval or tuple (math-verify decides), within the timeout.
"""

from __future__ import annotations

__all__ = ["TABLE", "UNITS_AND_FORMS"]

TABLE: list[tuple[str, str, bool]] = [
    # --- extraction: the last \boxed counts, nested braces, \fbox, markers
    (r"First \boxed{3}, then on reflection \boxed{5}.", "5", True),
    (r"First \boxed{5}, then on reflection \boxed{3}.", "5", False),
    (r"So $x = \boxed{\frac{1}{2}}$", "1/2", True),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", True),
    (r"\boxed{{12}}", "12", True),
    (r"\fbox{7}", "7", True),
    (r"\fbox{8}", "7", False),
    (r"\boxed 4", "4", True),
    (r"the answer is \boxed{6} and not \boxed{7", "6", True),  # truncated last box ignored
    ("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", "18", True),
    ("#### 1,234", "1234", True),
    ("#### 1,235", "1234", False),
    ("So the answer is 72.", "72", True),
    ("The final answer is: 3/4", "0.75", True),
    ("Final answer: 15 apples", "15", True),
    ("The answer is 16 dollars.", "17", False),
    ("She has 3 cats and 4 dogs, 7 pets", "7", True),  # last number fallback
    ("She has 3 cats and 4 dogs, 7 pets", "3", False),
    ("I do not know.", "3", False),
    ("", "3", False),
    # --- integers, signs, decimals
    (r"\boxed{42}", "42", True),
    (r"\boxed{042}", "42", True),
    (r"\boxed{-5}", "-5", True),
    (r"\boxed{−5}", "-5", True),  # unicode minus
    (r"\boxed{5}", "-5", False),
    (r"\boxed{+5}", "5", True),
    (r"\boxed{2.50}", "2.5", True),
    (r"\boxed{2.05}", "2.5", False),
    (r"\boxed{.5}", "0.5", True),
    (r"\boxed{3.}", "3", True),
    (r"\boxed{0.333}", r"\frac{1}{3}", False),  # near miss: not exact
    (r"\boxed{0.1}", "0.10000001", False),
    # --- thousands separators
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{1\,000}", "1000", True),  # thin space: math-verify reads 1*0
    (r"\boxed{1 000 000}", "1000000", True),
    (r"\boxed{1{,}000}", "1000", True),
    (r"\boxed{12\,345.5}", "12345.5", True),
    ("The total is 1\u2009000 grams", "1000", True),  # a literal thin space
    (r"\boxed{1,00}", "100", False),  # not a thousands group
    (r"\boxed{10,000}", "1000", False),
    # --- e-notation and scientific notation
    (r"\boxed{1.5e3}", "1500", True),  # math-verify reads 1.5*e*3
    (r"\boxed{1.5E3}", "1500", True),
    (r"\boxed{2e-3}", "0.002", True),
    (r"\boxed{1.5 \times 10^{3}}", "1500", True),
    (r"\boxed{1.5\cdot10^3}", "1500", True),
    (r"\boxed{1.5e4}", "1500", False),
    # --- fractions and mixed numbers
    (r"\boxed{\frac{3}{4}}", "0.75", True),
    (r"\boxed{\dfrac{3}{4}}", "3/4", True),
    (r"\boxed{\tfrac34}", "0.75", True),
    (r"\boxed{6/8}", "3/4", True),
    (r"\boxed{-\frac{1}{2}}", "-0.5", True),
    (r"\boxed{\frac{4}{3}}", "3/4", False),
    (r"\boxed{2\frac{1}{4}}", r"\frac{9}{4}", True),
    (r"\boxed{1/0}", "1", False),
    # --- percentages
    (r"\boxed{12.5\%}", "12.5", True),  # math-verify: 0.125 != 12.5
    (r"\boxed{12.5\%}", "0.125", True),
    (r"\boxed{25%}", "25", True),
    (r"\boxed{25}", r"25\%", True),
    (r"\boxed{12.5\%}", "12", False),
    (r"\boxed{13\%}", "0.125", False),
    # --- full-width and look-alike characters
    ("答案是 \\boxed{４２}", "42", True),  # math-verify finds nothing
    ("＃＃＃＃ ７", "7", True),
    (r"\boxed{４２}", "24", False),
    # --- currency, units, LaTeX decoration
    (r"\boxed{\$18}", "18", True),
    (r"\boxed{18 \text{ dollars}}", "18", True),
    (r"\boxed{90^\circ}", "90", True),
    (r"\boxed{90^{\circ}}", "90", True),
    (r"\boxed{\textbf{7}}", "7", True),
    (r"\boxed{\left(3\right)}", "3", True),
    (r"\boxed{x = 5}", "5", True),
    (r"\boxed{x = 6}", "5", False),
    # --- words are text, never products of letters
    (r"\boxed{grown}", "wrong", False),  # math-verify: g*r*o*w*n == w*r*o*n*g
    (r"\boxed{listen}", "silent", False),
    (r"\boxed{Yes}", "yes", True),
    (r"\boxed{\text{even}}", "odd", False),
    (r"\boxed{\text{(B)}}", "B", True),
    (r"\boxed{five}", "5", True),
    (r"\boxed{six}", "5", False),
    # --- symbolic: expressions, radicals, constants, tuples, intervals
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}", False),
    (r"\boxed{2\pi}", r"2\pi", True),
    (r"\boxed{3.14}", r"\pi", False),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    (r"\boxed{x^2+1}", "(x+1)^2", False),
    (r"\boxed{(1, 2)}", "(1,2)", True),
    (r"\boxed{(2, 1)}", "(1,2)", False),
    (r"\boxed{[0, 1)}", "[0,1)", True),
    (r"\boxed{[0, 1]}", "[0,1)", False),
    (r"\boxed{3, 5}", "5", False),  # a set of answers is not the answer
    # --- hostile: refused before sympy, never hangs
    (r"\boxed{9^{9^{9^{9}}}}", "5", False),
    (r"\boxed{10^{10^{8}}}", "5", False),
    (r"\boxed{1e999999999}", "5", False),
    (r"\boxed{99999!}", "5", False),
    ("\\boxed{" + "1" * 500 + "}", "1", False),
    # --- the failures listed in issue 16
    (r"$$\frac{1}{2}$$", "0.5", True),
    (r"So $x=\frac{1}{2}$.", "2", False),
    (r"So $x=\frac{1}{2}$.", "1/2", True),
    (r"\boxed{\frac{1}{}", "1", False),
    (r"\boxed{5 \text{ thousand}}", "5", False),
    (r"\boxed{5 \text{ thousand}}", "5000", False),  # a word is text, not a multiplier
    ("The answer is 3 million.", "3", False),
    (r"\boxed{5 pi}", "5", False),
    (r"\boxed{no}", "on", False),
    (r"\boxed{no}", "No", True),
    (r"\boxed{1e308}", "10^{308}", True),
    (r"\boxed{10^{308}}", "1e308", True),
    # --- the last box counts; a marker without an answer is no answer
    (r"\boxed{1} \boxed{2} \boxed{3}", "3", True),
    (r"\boxed{1} \boxed{2} \boxed{3}", "1", False),
    (r"\boxed{\boxed{4}}", "4", True),
    (r"Answer: \boxed{7}. Checking: 3 + 4 = 7, so 8 is wrong.", "7", True),
    (r"Answer: \boxed{7}. Checking: 3 + 4 = 7, so 8 is wrong.", "8", False),
    (r"\boxed{5} #### 6", "6", False),  # the box outranks ####
    (r"\boxed{5} #### 6", "5", True),
    ("#### 4\n#### 9", "9", True),
    ("#### 4\n#### 9", "4", False),
    ("The answer is 4. No wait, the answer is 9.", "9", True),
    ("The answer is 4. No wait, the answer is 9.", "4", False),
    ("The answer is:\n\n12", "12", True),
    (r"The answer is \boxed{12", "12", False),  # unclosed: truncated
    ("The answer is x. Also 5 apples.", "5", False),  # marker, not the last number
    ("#### \nthe total is 5", "5", False),  # an empty #### is no answer
    (r"\boxed{} and then 3", "3", False),  # an empty box is no answer
    (r"\boxed{\frac{3}{4}", "3/4", False),
    (r"$\boxed{\frac{3}{4}}$", "3/4", True),
    (r"Thus $\boxed{-2}$.", "-2", True),
    (r"\[\boxed{\dfrac{5}{2}}\]", "2.5", True),
    (r"**Final Answer:** \boxed{17}", "17", True),
    ("Final answer: 17", "17", True),
    ("FINAL ANSWER: 17", "17", True),
    ("the answer = 17", "17", True),
    ("I think it is 17", "17", True),  # no marker: the last number
    ("I think it is 17, not 18", "17", False),
    # --- the last formula, when it comes after the last number
    (r"We get $x = 3 + 4 = 7$.", "7", True),
    (r"We get $x = 3 + 4 = 7$.", "4", False),
    (r"So the value is $\sqrt{2}$.", "2", False),
    (r"So the value is $\sqrt{2}$.", r"\sqrt{2}", True),
    (r"Area $= 2\pi$", r"2\pi", True),
    (r"Since $n = 3$, there are 6 ways.", "6", True),
    (r"Since $n = 3$, there are 6 ways.", "3", False),
    (r"\(x = \frac{2}{3}\)", "2/3", True),
    (r"\[ y = 0.25 \]", "1/4", True),
    (r"\[ y = 0.25 \]", "1/3", False),
    (r"It costs $5 and then $10.", "10", True),
    (r"The total is $\$18$.", "18", True),  # \$ is a dollar sign, not a delimiter
    (r"The total is $\$18$.", "1", False),
    # --- exact fractions vs decimals
    (r"\boxed{0.5}", r"\frac12", True),
    (r"\boxed{0.125}", r"\frac{1}{8}", True),
    (r"\boxed{0.67}", r"\frac{2}{3}", False),
    (r"\boxed{0.6666666667}", r"\frac{2}{3}", False),
    (r"\boxed{0.3333333333}", "1/3", False),
    (r"\boxed{1.25}", r"\frac{5}{4}", True),
    (r"\boxed{1\frac{1}{4}}", "1.25", True),
    (r"\boxed{3\frac{1}{2}}", "7/2", True),
    (r"\boxed{3\frac{1}{2}}", "3/2", False),
    (r"\boxed{-0.75}", r"-\frac{3}{4}", True),
    (r"\boxed{0.75}", r"-\frac{3}{4}", False),
    (r"\boxed{\frac{10}{4}}", "2.5", True),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),
    (r"\boxed{2/4}", "0.5", True),
    (r"\boxed{4/2}", "0.5", False),
    (r"\boxed{\frac{1}{3}}", "0.33", False),
    (r"\boxed{0.1}", "1/10", True),
    (r"\boxed{0.10}", "0.1", True),
    (r"\boxed{1.000}", "1", True),
    (r"\boxed{1.001}", "1", False),
    # --- powers of ten and scientific notation are numbers
    (r"\boxed{10^{6}}", "1000000", True),
    (r"\boxed{10^6}", "1,000,000", True),
    (r"\boxed{10^{5}}", "1000000", False),
    (r"\boxed{2^{10}}", "1024", True),
    (r"\boxed{2^{10}}", "1000", False),
    (r"\boxed{10^{-3}}", "0.001", True),
    (r"\boxed{1e-3}", r"10^{-3}", True),
    (r"\boxed{3 \times 10^{8}}", "300000000", True),
    (r"\boxed{3 \times 10^{8}}", "3e8", True),
    (r"\boxed{3 \times 10^{8}}", "3e9", False),
    (r"\boxed{6.02 \times 10^{23}}", "6.02e23", True),
    (r"\boxed{1e100}", r"10^{100}", True),
    (r"\boxed{1e100}", r"10^{101}", False),
    (r"\boxed{-10^{2}}", "-100", True),
    (r"\boxed{5^3}", "125", True),
    (r"\boxed{10^{500}}", "1", False),  # refused beyond 10^400: never equal
    # --- units are ignored only when they are units
    (r"\boxed{5 \text{ cm}}", "5", True),
    (r"\boxed{5 \text{ cm}^2}", "5", True),
    (r"\boxed{12\text{ m}}", "12", True),
    (r"\boxed{12\,\mathrm{g}}", "12", True),
    (r"\boxed{60 \text{ km/h}}", "60", True),
    (r"\boxed{3 \text{ hours}}", "3", True),
    (r"\boxed{3 \text{ hours}}", "4", False),
    (r"\boxed{45 \text{ minutes}}", "45", True),
    (r"\boxed{\$1,250}", "1250", True),
    (r"\boxed{\$12.50}", "12.5", True),
    ("#### 18 dollars", "18", True),
    ("The answer is 20 eggs.", "20", True),
    ("The answer is 20 eggs.", "21", False),
    (r"\boxed{7 \text{ dozen}}", "7", False),
    (r"\boxed{7 \text{ dozen}}", "84", False),
    (r"\boxed{2 \text{ hundred}}", "2", False),
    (r"\boxed{4 \text{ billion}}", "4", False),
    ("The answer is 3 thousand.", "3", False),
    (r"\boxed{5 \text{ or } 6}", "5", False),
    (r"\boxed{5 and 6}", "5", False),
    (r"\boxed{5 squared}", "5", False),
    (r"\boxed{5 x}", "5", False),
    (r"\boxed{5\pi}", "5", False),
    (r"\boxed{25 percent}", "25", True),
    (r"\boxed{25 percent}", "0.25", True),
    (r"\boxed{25 percent}", "0.5", False),
    (r"\boxed{12\ \text{cm}}", "12", True),
    (r"\boxed{\dfrac{1}{4}\text{ of the pie}}", "1/4", True),
    (r"\boxed{x=2 \text{ or } x=3}", "2, 3", True),  # "or" lists answers
    (r"\boxed{x=2 \text{ or } x=4}", "2, 3", False),
    (r"\boxed{2 \text{ and } 3}", "3, 2", True),
    (r"\boxed{4 \text{ or } 5}", "4", False),
    (r"\boxed{30^\circ}", "30", True),
    (r"\boxed{30^{\circ}}", "60", False),
    # --- words of any length are text
    (r"\boxed{on}", "no", False),
    (r"\boxed{No}", "no", True),
    (r"\boxed{yes}", "no", False),
    (r"\boxed{\text{yes}}", "Yes", True),
    (r"\boxed{\text{False}}", "false", True),
    (r"\boxed{\text{True}}", "false", False),
    (r"\boxed{ab}", "ba", False),
    (r"\boxed{am}", "ma", False),
    (r"\boxed{it}", "ti", False),
    (r"\boxed{tea}", "eat", False),
    (r"\boxed{evil}", "live", False),
    (r"\boxed{Monday}", "monday", True),
    (r"\boxed{Tuesday}", "Monday", False),
    (r"\boxed{\text{Alice}}", "Alice", True),
    (r"\boxed{\text{Bob}}", "Alice", False),
    (r"\boxed{\text{(C)}}", "C", True),
    (r"\boxed{2ab}", "2ba", True),  # letters touching a digit are variables
    (r"\boxed{xy+1}", "yx+1", True),
    (r"\boxed{\sqrt{ab}}", r"\sqrt{ba}", True),
    (r"\boxed{no, 5}", "on, 5", False),
    (r"\boxed{(D)}", "C", False),
    (r"\boxed{A}", "A", True),
    (r"\boxed{A}", "B", False),
    (r"\boxed{seven}", "7", True),
    (r"\boxed{seven}", "8", False),
    (r"\boxed{twelve}", "12", True),
    ("The answer is no.", "yes", False),
    ("The answer is yes.", "yes", True),
    # --- symbolic: expressions, radicals, constants, sets
    (r"\boxed{\sqrt{12}}", r"2\sqrt{3}", True),
    (r"\boxed{\sqrt{12}}", r"3\sqrt{2}", False),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", True),
    (r"\boxed{\frac{\pi}{3}}", r"\pi/2", False),
    (r"\boxed{\pi}", r"\pi", True),
    (r"\boxed{e^{2}}", r"e^2", True),
    (r"\boxed{2x+3}", "3+2x", True),
    (r"\boxed{2x+3}", "3x+2", False),
    (r"\boxed{(x-1)(x+1)}", "x^2-1", True),
    (r"\boxed{(x-1)(x+2)}", "x^2-1", False),
    (r"\boxed{\frac{1}{\sqrt{3}}}", r"\frac{\sqrt{3}}{3}", True),
    (r"\boxed{\sqrt{3}/3}", r"\frac{1}{3}", False),
    (r"\boxed{(3, 4)}", "(3,4)", True),
    (r"\boxed{(4, 3)}", "(3,4)", False),
    (r"\boxed{(0, \infty)}", r"(0,\infty)", True),
    (r"\boxed{[0, \infty)}", r"(0,\infty)", False),
    (r"\boxed{\{1, 2, 3\}}", r"\{3, 2, 1\}", True),
    (r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", False),
    (r"\boxed{\sqrt{2}+\sqrt{3}}", r"\sqrt{3}+\sqrt{2}", True),
    (r"\boxed{\log_2 8}", "3", True),
    (r"\boxed{\log_2 8}", "4", False),
    (r"\boxed{\sin(\pi/6)}", r"\frac{1}{2}", True),
    (r"\boxed{\binom{5}{2}}", "10", True),
    (r"\boxed{\binom{5}{2}}", "20", False),
    (r"\boxed{5!}", "120", True),
    (r"\boxed{4!}", "120", False),
    (r"\boxed{999!}", "1", False),
    (r"\boxed{x=3}", "3", True),
    (r"\boxed{y = -2}", "-2", True),
    (r"\boxed{y = 2}", "-2", False),
    # --- adversarial inputs: refused or stopped by the deadline, never accepted
    (r"\boxed{{9}^{{9}^{{9}^{9}}}}", "5", False),
    (r"\boxed{{10}^{{10}^{10}}}", "5", False),
    (r"\boxed{(10^{10})!}", "5", False),
    (r"\boxed{(99999999)!}", "5", False),
    (r"\boxed{10^{999 \cdot 999 \cdot 999}}", "5", False),
    ("\\boxed{" * 5000, "1", False),
    ("\\boxed{" * 5000 + " 1", "1", False),  # unclosed boxes: not the last number
    ("$" * 20000 + "1", "1", True),  # no closed formula after it: the last number
    # --- repeating decimals are exact: the block repeats forever
    (r"\boxed{0.\overline{3}}", "1/3", True),
    (r"\boxed{0.\overline{3}}", r"\frac{1}{3}", True),
    (r"\boxed{\frac{1}{3}}", r"0.\overline{3}", True),
    (r"\boxed{0.\overline3}", "1/3", True),
    (r"\boxed{0.\bar{3}}", "1/3", True),
    (r"\boxed{0.(3)}", "1/3", True),
    (r"\boxed{0.\dot{3}}", "1/3", True),
    (r"\boxed{0.1\overline{6}}", "1/6", True),
    (r"\boxed{0.1(6)}", "1/6", True),
    (r"\boxed{0.1\dot{6}}", r"\frac{1}{6}", True),
    (r"\boxed{0.\overline{142857}}", r"\frac{1}{7}", True),
    (r"\boxed{0.\dot{1}4285\dot{7}}", "1/7", True),  # dots over the block's ends
    (r"\boxed{0.\overline{12}}", "4/33", True),
    (r"\boxed{2.\overline{5}}", "23/9", True),
    (r"\boxed{-0.\overline{3}}", r"-\frac{1}{3}", True),
    (r"\boxed{33.\overline{3}\%}", "1/3", True),
    (r"\boxed{0.\overline{9}}", "1", True),
    ("So x = 0.(3)", "1/3", True),  # last number: the block belongs to it
    (r"So $x = 0.\overline{3}$", "1/3", True),
    (r"\boxed{0.\overline{3}}", "0.3", False),
    (r"\boxed{0.\overline{3}}", "0.333", False),
    (r"\boxed{0.333}", r"0.\overline{3}", False),
    (r"\boxed{0.(6)}", "1/6", False),  # 2/3
    (r"\boxed{0.1\overline{6}}", "1/16", False),
    (r"\boxed{0.\overline{16}}", "1/6", False),  # 16/99
    (r"\boxed{0.\overline{142857}}", r"\frac{1}{6}", False),
    (r"\boxed{0.\overline{3}}", r"-\frac{1}{3}", False),
    ("So x = 0.(3)", "3", False),  # not its last digit
    (r"The decimal is 0.\overline{3}", "3", False),
    # --- a multiple-choice letter on the last "Answer:" line
    ("Answer: (B)", "B", True),
    ("Answer: (B)", "(B)", True),
    ("Answer: B", "(B)", True),
    ("Answer: B", "B", True),
    ("Answer: B.", "B", True),
    ("Answer: [B]", "B", True),
    ("Answer: **B**", "B", True),
    ("**Answer:** B", "B", True),
    (r"Answer: $\text{(B)}$", "B", True),
    ("Answer: (B) 42", "B", True),  # the label, then the option's text
    ("Answer: B) 42", "B", True),
    ("ANSWER: D", "D", True),
    ("The options differ in sign.\nAnswer: D.", "D", True),
    ("So it is A, I think.\nAnswer: B", "B", True),  # the stray A is prose
    ("Answer: B\nWait, that is wrong.\nAnswer: C", "C", True),  # the last one counts
    ("The answer is 5.\nAnswer: B", "B", True),  # a later Answer: line
    ("The answer is (A) 12", "A", True),
    (r"\boxed{(B)}", "B", True),
    (r"\boxed{b}", "(B)", True),  # a label, in either case
    ("Answer: (C)", "B", False),
    ("Answer: B", "C", False),
    ("Answer: (B)", "2", False),
    (r"\boxed{2}", "(B)", False),  # a number is no label (sympy reads (B) as b)
    ("Answer: B\nWait, that is wrong.\nAnswer: C", "B", False),
    ("Answer: A pair of shoes costs 5", "A", False),  # prose: the last number, 5
    ("Answer: I think it is 5", "I", False),
    ("A is the correct option.", "A", False),  # no marker, no number: no answer
    ("Option A looks right, so the count is 4", "A", False),
    ("Answer: b", "B", False),  # a lower-case letter after Answer: is prose
    ("Answer: B, since 2 + 2 = 4", "B", False),  # not alone on its line: the last number
    ("#### 5\nAnswer: B", "B", False),  # #### outranks
    (r"\boxed{C} Answer: B", "B", False),  # the box outranks
    ("Answer: B\nThe answer is C.", "B", False),  # a later "the answer is"
    # --- i standing alone is the imaginary unit
    (r"\boxed{i^2}", "-1", True),
    (r"\boxed{-1}", "i^2", True),
    (r"\boxed{2i}", "2 i", True),
    (r"\boxed{(1+i)^2}", "2i", True),
    (r"\boxed{i^3}", "-i", True),
    (r"\boxed{3+4i}", "4i+3", True),
    (r"\boxed{\frac{1+i}{1-i}}", "i", True),
    (r"\boxed{i}", r"\sqrt{-1}", True),
    (r"\boxed{e^{i\pi}}", "-1", True),
    (r"\boxed{i\sqrt{2}}", r"\sqrt{2}i", True),
    (r"\boxed{\mathrm{i}}", "i", True),
    (r"\boxed{\sin(\pi/6)}", r"\frac{1}{2}", True),  # real answers as before
    (r"\boxed{\sum_{i=1}^{3} i}", "6", True),  # an index, not the unit
    (r"\boxed{x_i}", "x_i", True),
    (r"\boxed{i^2}", "1", False),
    (r"\boxed{2i}", "2", False),
    (r"\boxed{i}", "1", False),
    (r"\boxed{3-4i}", "3+4i", False),
    (r"\boxed{(1+i)^2}", "2", False),
    (r"\boxed{(1+i)^2}", "-2i", False),
    (r"\boxed{i^{10^{9}}}", "1", False),  # a tower: refused before sympy
    # --- a numeral's subscript is its base
    (r"\boxed{12_8}", "10", True),
    (r"\boxed{12_{8}}", "10", True),
    (r"\boxed{1010_2}", "10", True),
    (r"\boxed{-12_8}", "-10", True),
    (r"\boxed{1A_{16}}", "26", True),
    (r"\boxed{FF_{16}}", "255", True),
    (r"\boxed{\text{A}_{11}}", "10", True),
    (r"\boxed{12_8}", "12_{8}", True),
    (r"\boxed{1010_2}", "12_8", True),  # both explicit: the same number
    (r"\boxed{12}", "12_8", True),  # bare digits in the reference's base
    (r"\boxed{10_{10}}", "12_8", True),
    ("So the number is 12_8", "10", True),  # last number: the subscript belongs to it
    (r"\boxed{12_8}", "12", False),  # 10, not 12
    (r"\boxed{12_{8}}", "12", False),
    (r"\boxed{1010_2}", "1010", False),
    (r"\boxed{10}", "12_8", False),  # the question asked for base 8
    (r"\boxed{12.0}", "12_8", False),
    (r"\boxed{9}", "11_8", False),  # no base-8 numeral
    (r"\boxed{19_8}", "17", False),  # 9 is no base-8 digit
    (r"\boxed{19_8}", "19", False),
    (r"\boxed{12_1}", "12", False),
    (r"\boxed{12_{40}}", "12", False),
    (r"\boxed{1A_{16}}", "1A", False),
    (r"\boxed{12_8+1}", "13", False),  # sympy would drop the subscript
    (r"\boxed{12_8+1}", "11", False),
    (r"\boxed{12_8 \text{ apples}}", "10", False),
    ("So the number is 12_8", "12", False),
]

# Issue 54's classes (units, angles, infinity, matrices, mixed numbers, towers, braces),
# one policy line a row; part of TABLE.
UNITS_AND_FORMS: list[tuple[str, str, bool]] = [
    # --- units are part of the answer (issue 54; plugins/rewards/math/units.py)
    (r"\boxed{5 \text{ km}}", r"5000\text{ m}", True),  # known units convert exactly
    (r"\boxed{5 \text{ km}}", r"5\text{ m}", False),  # the same number, another unit
    (r"\boxed{120 \text{ minutes}}", "2 hours", True),  # time: 60 s a minute, 3600 an hour
    (r"\boxed{2 \text{ hours}}", "2 minutes", False),  # the same number, another unit
    (r"\boxed{3000 \text{ grams}}", "3 kg", True),  # mass: exact factors
    (r"\boxed{3 \text{ kg}}", "3 grams", False),  # the same number, another unit
    (r"\boxed{12 \text{ inches}}", "1 foot", True),  # an inch is 2.54 cm exactly
    (r"\boxed{5280 \text{ ft}}", "1 mile", True),  # a mile is 5280 feet exactly
    (r"\boxed{16 \text{ ounces}}", "1 lb", True),  # a pound is 16 ounces exactly
    (r"\boxed{2 \text{ hours}}", "2 kg", False),  # different dimensions never equal
    (r"\boxed{60 \text{ km/h}}", "1 km/min", True),  # a unit with a denominator converts
    (r"\boxed{60 \text{ km/h}}", "60 km/min", False),  # ... and its denominator counts
    (r"\boxed{15 \text{ oranges}}", "15 apples", False),  # unknown units: compared as text
    (r"\boxed{15 \text{ apple}}", "15 apples", True),  # ... a plural s dropped
    (r"\boxed{45}", r"45^\circ", True),  # a bare number answers a quantity with its number
    (r"\boxed{5 \text{ km}}", "5", True),  # a quantity answers a bare reference by its number
    (r"\boxed{5000 \text{ m}}", "5", False),  # ... its number, not a conversion
    (r"\boxed{50\%}", "0.5", True),  # a percentage is its number and its fraction
    # --- degrees and radians (units.py): d degrees is d/180 of pi
    (r"\boxed{30^\circ}", r"\frac{\pi}{6}", True),  # degrees against radians
    (r"\boxed{\frac{\pi}{2}}", r"90^{\circ}", True),  # radians against degrees
    (r"\boxed{45 \text{ degrees}}", r"\frac{\pi}{4}", True),  # degrees spelled out
    (r"\boxed{60^\circ}", r"\frac{\pi}{6}", False),  # a different angle
    (r"\boxed{\frac{2\pi}{3} \text{ rad}}", r"120^\circ", True),  # radians with their unit
    # --- infinity in every common spelling (forms.py)
    (r"\boxed{\infty}", "infinity", True),  # a word spelling
    (r"\boxed{∞}", r"\infty", True),  # the symbol
    (r"\boxed{Infinity}", r"\infty", True),  # case does not matter
    (r"\boxed{oo}", r"\infty", True),  # sympy's spelling
    (r"\boxed{-\infty}", r"\infty", False),  # the sign counts
    (r"\boxed{(-\infty, 3)}", r"(-infinity, 3)", True),  # inside an interval
    # --- matrices and vectors (forms.py): shape and every entry
    (r"\boxed{[[1,2],[3,4]]}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),  # nested list
    (r"\boxed{[[1,2],[3,5]]}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", False),  # an entry
    (r"\boxed{[[1,3],[2,4]]}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", False),  # transposed
    (r"\boxed{\begin{bmatrix}1&0\\0&1\end{bmatrix}}", r"[[1,0],[0,1]]", True),  # bmatrix
    (r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", "(1, 2)", True),  # a column is a vector
    (r"\boxed{[1,2,3]}", r"\begin{pmatrix}1\\2\\3\end{pmatrix}", True),  # a list is one too
    (r"\boxed{(1, 2)}", r"\begin{pmatrix}1\\2\\3\end{pmatrix}", False),  # lengths differ
    (r"\boxed{\begin{pmatrix}\frac{1}{2}&0\end{pmatrix}}", "[[0.5, 0]]", True),  # entries
    # --- mixed numbers (forms.py)
    (r"\boxed{2 1/4}", r"\frac{9}{4}", True),  # whole and fraction, plain
    (r"\boxed{2\frac{1}{4}}", "2.25", True),  # whole and fraction, LaTeX
    (r"\boxed{-2 1/4}", r"-\frac{9}{4}", True),  # the sign covers both parts
    (r"\boxed{2 1/4}", r"\frac{1}{2}", False),  # never the product 2 * 1/4
    # --- bounded power towers (forms.py): exact below 4096 bits, refused above
    (r"\boxed{2^{2^{3}}}", "256", True),  # a tower reads from the top
    (r"\boxed{{2^{3}}^{2}}", "64", True),  # braces group the base
    (r"\boxed{2^{2^{3}}}", "64", False),  # not (2^2)^3
    (r"\boxed{3^{3^{2}}}", "19683", True),  # 3^9
    (r"\boxed{9^{9^{9}}}", "1", False),  # past the bound: refused
    # --- redundant braces (forms.py)
    (r"\boxed{{\{1,2\}}}", r"\{1,2\}", True),  # group braces around a set
    (r"\boxed{\{\{1,2\}\}}", r"\{1,2\}", False),  # a set holding a set is not the set
    (r"\boxed{{{\frac{1}{2}}}}", "0.5", True),  # braces around a number
]
TABLE += UNITS_AND_FORMS
