#!/usr/bin/env python3
"""Tests of tools/make-labs: the starter replaces each SOLUTION block, keeps hints, never
overwrites an attendee's edits without --force, and --check catches drift."""
import importlib.machinery
import importlib.util
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
loader = importlib.machinery.SourceFileLoader("make_labs", str(ROOT / "tools" / "make-labs"))
spec = importlib.util.spec_from_loader("make_labs", loader)
make_labs = importlib.util.module_from_spec(spec)
loader.exec_module(make_labs)

SOLUTION = """\
#include "x.hpp"
int add(int a, int b) {
  // BEGIN SOLUTION step 2: add "two" numbers
  // HINT: use +
  int sum = a + b;  // the answer
  return sum;
  // END SOLUTION
}
"""


class MakeLabsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp())
        (self.tmp / "solutions" / "07_demo").mkdir(parents=True)
        self.solution = self.tmp / "solutions" / "07_demo" / "demo.cpp"
        self.solution.write_text(SOLUTION)
        make_labs.ROOT = self.tmp

    def run_tool(self, *args):
        old = sys.argv
        sys.argv = ["make-labs", *args]
        try:
            return make_labs.main()
        finally:
            sys.argv = old

    def starter(self):
        return (self.tmp / "labs" / "07_demo" / "demo.cpp").read_text()

    def test_block_becomes_not_implemented_with_hints(self):
        self.assertEqual(self.run_tool(), 0)
        text = self.starter()
        self.assertIn('throw scalelab::NotImplemented(', text)
        self.assertIn("lab 07 step 2: add 'two' numbers (README.md#step-2)", text)
        self.assertIn("// HINT: use +", text)
        self.assertNotIn("a + b", text, "the solution must not leak into the starter")
        self.assertIn('#include "common/errors.hpp"', text)

    def test_a_destructor_ends_with_the_verdict_not_a_throw(self):
        # a destructor is noexcept: `throw` there is std::terminate (and gcc's -Wterminate)
        self.solution.write_text(SOLUTION + "Scope::~Scope() {\n  // BEGIN SOLUTION step 3: undo\n"
                                 "  undo();\n  // END SOLUTION\n}\n")
        self.assertEqual(self.run_tool(), 0)
        text = self.starter()
        dtor = text[text.index("Scope::~Scope() {"):]
        self.assertIn('scalelab::not_implemented_in_destructor(\n      "lab 07 step 3: undo (README.md#step-3)");', dtor)
        self.assertNotIn("throw", dtor)
        self.assertIn("throw scalelab::NotImplemented(", text, "step 2, a function, still throws")
        self.assertIn('#include "common/runtime.hpp"', text)

    def test_check_detects_drift(self):
        self.assertEqual(self.run_tool(), 0)
        self.assertEqual(self.run_tool("--check"), 0)
        self.solution.write_text(SOLUTION.replace("int add", "long add"))
        self.assertEqual(self.run_tool("--check"), 1)

    def test_edited_starter_is_kept_unless_forced(self):
        self.run_tool()
        path = self.tmp / "labs" / "07_demo" / "demo.cpp"
        path.write_text(self.starter().replace("throw", "return a + b; //"))
        self.solution.write_text(SOLUTION.replace("int add", "long add"))
        self.assertEqual(self.run_tool(), 0)
        self.assertIn("return a + b; //", self.starter(), "an attendee's edit was overwritten")
        self.assertEqual(self.run_tool("--force", "07"), 0)
        self.assertIn("long add", self.starter())

    def test_unclosed_block_is_an_error(self):
        self.solution.write_text(SOLUTION.replace("  // END SOLUTION\n", ""))
        self.assertEqual(self.run_tool(), 1)

    def test_unknown_lab_is_a_usage_error(self):
        self.assertEqual(self.run_tool("42"), 2)

    def test_repository_starters_are_in_sync(self):
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "make-labs"), "--check"],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
