#!/usr/bin/env python3
"""The labs' READMEs keep the shape an attendee relies on: the first screen says the time and
the steps (core or optional); each step opens at its own anchor (the starters' "not implemented:
... (README.md#step-K)" pointers land on it, not on a section before it), states its goal and
its test, and keeps its recipes in collapsed "Stuck?" hints (what `./scalelab hint NN K` prints);
the graders a README names exist. Each check is a function, planted with a README that breaks it.
"""
import pathlib
import re
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABS = sorted(p for p in (ROOT / "labs").iterdir() if re.match(r"\d\d_", p.name))

STEP = re.compile(r"^## Step (\d+)\b(.*?)$(.*?)(?=^## |\Z)", re.M | re.S)
HINT = re.compile(r"<details>\s*<summary>\s*Stuck\?")


def first_screen(text):
    """What is wrong with the README's opening: the time and the step table, before Step 1."""
    head = text.split("\n## Step 1", 1)[0][:6000]
    problems = []
    if "**Time:**" not in head:
        problems.append("no **Time:** line before Step 1")
    if not re.search(r"^\|\s*step\s*\|", head, re.M):
        problems.append("no step table (| step | you write | time | graded |) before Step 1")
    return problems


def anchors(text):
    """Each `<a id="step-K">` stands right before `## Step K`, and each step has one."""
    problems = []
    for m in re.finditer(r'<a id="step-(\d+)"></a>\s*\n(.*)', text):
        if not m.group(2).startswith(f"## Step {m.group(1)}"):
            problems.append(f'<a id="step-{m.group(1)}"> stands before "{m.group(2)[:50]}", '
                            f"not before ## Step {m.group(1)}")
    found = set(re.findall(r'<a id="step-(\d+)"></a>', text))
    for k, _, _ in STEP.findall(text):
        if k not in found:
            problems.append(f'## Step {k} has no <a id="step-{k}"></a> before it')
    return problems


def steps(text):
    """Each step states a goal and a test and has a Stuck? hint, unless it has nothing graded."""
    problems = []
    for k, title, body in STEP.findall(text):
        if "nothing graded" in title:
            continue
        for part in ("**Goal", "**Test"):
            if part not in body:
                problems.append(f"step {k}: no {part}**")
        if not HINT.search(body):
            problems.append(f"step {k}: no <details><summary>Stuck? ...</summary> hint")
    return problems


def pointers(lab, text):
    """Every README.md#anchor the lab's sources point at exists in its README."""
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for h in re.findall(r"^#+\s+(.*)$", text, re.M):  # GitHub's heading anchors
        ids.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    problems = []
    sources = list(lab.glob("*.cpp")) + list(lab.glob("*.hpp"))
    solution = ROOT / "solutions" / lab.name
    sources += list(solution.glob("*.cpp")) if solution.is_dir() else []
    for src in sources:
        for anchor in set(re.findall(r"README\.md#([\w\-]+)", src.read_text())):
            if anchor not in ids:
                problems.append(f"{src.relative_to(ROOT)} points at README.md#{anchor}: no such anchor")
    return problems


def graders(lab, text):
    """Every StepK_Name the README names is a test group of tests/<lab> (StepK_* names the step)."""
    tests = ROOT / "tests" / lab.name
    code = "".join(p.read_text() for p in tests.rglob("*.cpp")) if tests.is_dir() else ""
    groups = set(re.findall(r"\b(Step\d+_\w+?)\s*[,)]", code)) | set(re.findall(r"\bStep\d+_\w+", code))
    problems = []
    for name in sorted(set(re.findall(r"`(Step\d+_[A-Za-z0-9_]+)", text))):
        group = name.split(".")[0]
        if not any(g == group or g.startswith(group) for g in groups):
            problems.append(f"names {name}: no such test group in tests/{lab.name}")
    return problems


def problems_of(lab, text):
    return (first_screen(text) + anchors(text) + steps(text) + pointers(lab, text) +
            graders(lab, text))


class LabReadmes(unittest.TestCase):
    def test_every_lab(self):
        self.assertGreaterEqual(len(LABS), 13)
        for lab in LABS:
            with self.subTest(lab=lab.name):
                text = (lab / "README.md").read_text()
                self.assertEqual(problems_of(lab, text), [])


GOOD = """# Lab 99
**Time:** the core, steps 1-2, 60 min.

| step | you write | time | graded |
|---|---|---|---|

<a id="step-1"></a>
## Step 1: one (core, 30 min)

**Goal.** a goal. **Test.** `Step1_*`.

<details><summary>Stuck? a nudge</summary>

the recipe
</details>

<a id="step-2"></a>
## Step 2: two (optional, nothing graded)

Run it.
"""


class Planted(unittest.TestCase):
    """Each check on a README that breaks it (and on one that does not)."""
    lab = ROOT / "labs" / "03_ddp"

    def test_a_good_readme_passes(self):
        self.assertEqual(first_screen(GOOD) + anchors(GOOD) + steps(GOOD), [])

    def test_no_time_line(self):
        self.assertTrue(first_screen(GOOD.replace("**Time:**", "Time")))

    def test_an_anchor_before_another_section(self):
        # the starter's pointer would land on the bf16 notes, not on the step
        bad = GOOD.replace('<a id="step-2"></a>\n## Step 2', '<a id="step-2"></a>\n### bf16\n\n## Step 2')
        self.assertTrue(any("stands before" in p for p in anchors(bad)))

    def test_a_step_without_a_hint(self):
        bad = GOOD.replace("<details><summary>Stuck? a nudge</summary>", "<details><summary>Notes</summary>")
        self.assertEqual(steps(bad), ["step 1: no <details><summary>Stuck? ...</summary> hint"])

    def test_a_step_without_a_goal(self):
        self.assertEqual(steps(GOOD.replace("**Goal.**", "Goal:")), ["step 1: no **Goal**"])

    def test_a_grader_that_does_not_exist(self):
        self.assertTrue(graders(self.lab, "`Step1_NoSuchGroup` checks it"))
        self.assertEqual(graders(self.lab, "`Step1_Broadcast` and `Step3_*`"), [])

    def test_a_pointer_to_a_missing_anchor(self):
        text = (self.lab / "README.md").read_text()
        self.assertEqual(pointers(self.lab, text), [])
        self.assertTrue(pointers(self.lab, text.replace('<a id="step-2"></a>', "")
                                 .replace("## Step 2", "## The second")))


if __name__ == "__main__":
    unittest.main()
