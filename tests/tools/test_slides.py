#!/usr/bin/env python3
"""Tests of the decks (slides/*.md), their plots (tools/plot, slides/data, slides/img) and the
images the READMEs show.

Always: every image a deck, a README or docs/*.md references exists; every data file in
slides/data parses with tools/plot's parser for its kind; the decks of labs 00-12 and the
overview, and those labs' READMEs, show at least one plot.
With pandoc (./scalelab setup --docs): every deck renders to one self-contained HTML file that
needs no network. With chromium too: no slide's content overflows its 1280x720 box.
With matplotlib: tools/plot draws an SVG from a data file. Tests whose tool is missing are skipped
and say which tool.
"""
import importlib.machinery
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLIDES = ROOT / "slides"
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<img\s[^>]*src=\"([^\"]+)\"")


def load_plot():
    loader = importlib.machinery.SourceFileLoader("scalelab_plot", str(ROOT / "tools" / "plot"))
    spec = importlib.util.spec_from_loader("scalelab_plot", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def decks():
    return sorted(SLIDES.glob("*.md"))


def markdown_files():
    files = decks() + sorted(ROOT.glob("labs/*/README.md")) + [ROOT / "README.md"] + sorted(ROOT.glob("docs/*.md"))
    return [f for f in files if f.is_file()]


def image_refs(path):
    text = path.read_text(encoding="utf-8")
    # Images inside fenced code blocks are examples, not references.
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for m in IMAGE.finditer(text):
        ref = m.group(1) or m.group(2)
        if not re.match(r"^[a-z]+:", ref):  # http:, https:, data: are not files here
            yield ref.split("#")[0]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class ImagesTest(unittest.TestCase):
    def test_every_referenced_image_exists(self):
        missing = []
        for md in markdown_files():
            for ref in image_refs(md):
                if not (md.parent / ref).is_file():
                    missing.append(f"{md.relative_to(ROOT)}: {ref}")
        self.assertEqual(missing, [], "images referenced but not in the tree")

    def test_every_lab_and_the_overview_show_a_plot(self):
        wanted = ([SLIDES / "overview.md"] + sorted(SLIDES.glob("[0-9][0-9]_*.md")) +
                  sorted(ROOT.glob("labs/[0-9][0-9]_*/README.md")))
        self.assertGreaterEqual(len(wanted), 15)
        without = [str(f.relative_to(ROOT)) for f in wanted
                   if not any(ref.endswith((".svg", ".png")) and "img/" in ref for ref in image_refs(f))]
        self.assertEqual(without, [], "decks or READMEs without a plot from slides/img/")

    def test_every_deck_has_a_title(self):
        for deck in decks():
            head = deck.read_text(encoding="utf-8").split("\n---", 1)[0]
            self.assertRegex(head, r"(?m)^title: ", f"{deck.name}: no title in its YAML header")


class PlotTest(unittest.TestCase):
    KINDS = {"01_bench": "parse_bench", "01_latency": "parse_bench", "02_": "parse_steps", "03_": "parse_steps",
             "04_": "parse_overlap", "05_": "parse_accum", "06_": "parse_checkpoint",
             "07_": "parse_tp", "08_": "parse_pipeline", "09_": "parse_zero", "10_": "parse_grid",
             "11_": "parse_cp", "12_": "parse_moe"}

    def test_every_data_file_parses(self):
        plot = load_plot()
        files = sorted((SLIDES / "data").glob("*.txt"))
        self.assertTrue(files, "no data in slides/data")
        for f in files:
            kind = next((k for prefix, k in self.KINDS.items() if f.name.startswith(prefix)), None)
            if kind is None:
                continue
            with self.subTest(data=f.name):
                getattr(plot, kind)(f.read_text(encoding="utf-8"))

    def test_parsers_on_the_programs_lines(self):
        plot = load_plot()
        d = plot.parse_steps("step=0 loss=5.5567 lr=1e-4 dt=1ms\n    single-device loss=5.556716  |ddp - single|=1.21e-08\n"
                             "step=1 loss=5.2 lr=1e-4\nstep=1 val_loss=5.3\n")
        self.assertEqual(d["loss"], [(0, 5.5567), (1, 5.2)])
        self.assertEqual(d["twin"], [(0, 5.556716, 1.21e-08)])
        self.assertEqual(d["val"], [(1, 5.3)])
        rows = plot.parse_checkpoint("every          512.0KiB     512.0KiB       4.8MiB       38.7     1.33x\n")["rows"]
        self.assertEqual(rows[0][0], "every")
        self.assertEqual(rows[0][1], 512 * 1024)
        self.assertEqual(plot.parse_accum("     4            2       5.6MiB      0.25x\n")[0][:2], (4, 2))
        with self.assertRaises(plot.NoData):
            plot.parse_bench("nothing here\n")

    def test_plot_draws_an_svg(self):
        probe = "import matplotlib"
        pythons = [p for p in ("/usr/bin/python3", shutil.which("python3")) if p]
        if not any(subprocess.run([p, "-c", probe], capture_output=True).returncode == 0 for p in pythons):
            self.skipTest("matplotlib is not installed (./scalelab setup --docs): tools/plot not run")
        data = sorted((SLIDES / "data").glob("05_*.txt")) or sorted((SLIDES / "data").glob("06_*.txt"))
        kind = "accum" if data[0].name.startswith("05_") else "checkpoint"
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "p.svg"
            proc = subprocess.run([str(ROOT / "tools" / "plot"), kind, str(data[0]), "-o", str(out), "--command", "x"],
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("<svg", out.read_text())

    def test_plot_usage_errors(self):
        proc = subprocess.run([str(ROOT / "tools" / "plot"), "bench", "/nonexistent.txt", "-o", "/tmp/x.svg"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)


class LauncherTest(unittest.TestCase):
    def test_usage_errors(self):
        for args, words in ((["slides", "99"], ""), (["slides", "--bogus"], "unknown option"),
                            (["docs", "extra"], "no arguments")):
            with self.subTest(args=args):
                proc = subprocess.run([str(ROOT / "scalelab"), *args], capture_output=True, text=True, timeout=120)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                lines = [l for l in proc.stderr.splitlines() if l.strip()]
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertTrue(lines[0].startswith("error: "), lines[0])
                self.assertIn(words, lines[0])


@unittest.skipUnless(shutil.which("pandoc"), "pandoc is not installed (./scalelab setup --docs): decks not rendered")
class RenderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = pathlib.Path(cls.tmp.name)
        cls.proc = subprocess.run([str(ROOT / "scalelab"), "slides", "--out", str(cls.out)],
                                  capture_output=True, text=True, timeout=600)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_deck_renders_self_contained(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        for deck in decks():
            html = self.out / (deck.stem + ".html")
            with self.subTest(deck=deck.name):
                self.assertTrue(html.is_file(), f"{html} not written")
                text = html.read_text(encoding="utf-8")
                self.assertGreaterEqual(text.count("<section"), 3, "fewer than 3 slides")
                # Offline: nothing loaded from the network, every image embedded.
                self.assertIsNone(re.search(r"<(?:script|img|link)[^>]+(?:src|href)=\"https?:", text))
                self.assertIsNone(re.search(r"<img[^>]+src=\"(?!data:)", text), "an image is not embedded")

    @unittest.skipUnless(chromium(), "chromium is not installed (./scalelab setup --docs): overflow not checked")
    def test_no_slide_overflows(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        bad = []
        for deck in decks():
            html = self.out / (deck.stem + ".html")
            proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                                   "--window-size=1280,720", "--dump-dom", f"file://{html}#all"],
                                  capture_output=True, text=True, timeout=120)
            m = re.search(r'data-overflow-count="(\d+)"', proc.stdout)
            if not m:
                bad.append(f"{deck.name}: the deck's script did not run (no data-overflow-count)")
            elif m.group(1) != "0":
                ids = re.findall(r'<section id="([^"]+)"[^>]*data-overflow="yes"', proc.stdout)
                bad.append(f"{deck.name}: {m.group(1)} slides overflow: {', '.join(ids)}")
        self.assertEqual(bad, [], "open build/slides/DECK.html#all: overflowing slides are outlined in red")


if __name__ == "__main__":
    unittest.main(verbosity=2)
