#!/usr/bin/env python3
"""Unit tests of tools/torch_crosscheck.py: it must catch a wrong number.

Exports one f64 step with dtp-export-step, then perturbs a copy of it (one
gradient element, one logit, the zero-in-exact-arithmetic attn.k.bias
gradient, the loss) and checks that the cross-check fails and names what was
perturbed, while the untouched step passes. Also checks that a Python without
torch makes the script exit 77 with "torch not installed: skipped".

Run: python3 tools/test_torch_crosscheck.py --exporter build/bin/dtp-export-step
(CTest runs it as crosscheck.torch.mutations). Exits 77 (skipped) where torch
cannot be imported, after checking that skip message.
"""

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
SCRIPT = TOOLS / "torch_crosscheck.py"
sys.path.insert(0, str(TOOLS))
import torch_crosscheck  # noqa: E402

EXPORTER = None  # set from --exporter
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


class NoTorch(unittest.TestCase):
    def test_exit_77_with_reason(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "torch"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write("raise ImportError('no torch here')\n")
            env = dict(os.environ, PYTHONPATH=tmp)
            run = subprocess.run([sys.executable, str(SCRIPT), "--step", "/nonexistent.json"],
                                 env=env, capture_output=True, text=True)
        self.assertEqual(run.returncode, 77, run.stdout + run.stderr)
        self.assertIn("torch not installed: skipped", run.stdout)


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class Mutations(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(cls.tmp.name, "step.json")
        subprocess.run([EXPORTER, "--out", path, "--dtype", "f64"], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            cls.step = json.load(f)
        cls.tol = torch_crosscheck.default_tolerance("f64", "cpu")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, step):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = torch_crosscheck.compare(step, self.tol)
        return status, out.getvalue()

    def param(self, step, name):
        return next(p for p in step["params"] if p["name"] == name)

    def assert_fails_naming(self, step, name, line_start):
        status, text = self.check(step)
        self.assertEqual(status, 1, text)
        fail_lines = [line for line in text.splitlines() if " FAIL" in line and not line.startswith("FAIL:")]
        self.assertEqual(len(fail_lines), 1, text)
        self.assertTrue(fail_lines[0].startswith(line_start), text)
        self.assertIn(f"failed: {name}", text.splitlines()[-1])
        return text

    def test_untouched_step_passes(self):
        status, text = self.check(self.step)
        self.assertEqual(status, 0, text)
        self.assertIn("zero in exact arithmetic", text)

    def test_gradient_element(self):
        step = copy.deepcopy(self.step)
        p = self.param(step, "block.1.mlp.fc.weight")
        p["grad"][5] += 1e-9 * max(abs(g) for g in p["grad"])  # 1e-9 relative: far above f64 rounding
        self.assert_fails_naming(step, "block.1.mlp.fc.weight", "block.1.mlp.fc.weight ")

    def test_zero_gradient_is_still_checked(self):
        step = copy.deepcopy(self.step)
        self.param(step, "block.0.attn.k.bias")["grad"][3] = 1e-12  # floor is ~1e-5: 1e-7 of it
        self.assert_fails_naming(step, "block.0.attn.k.bias", "block.0.attn.k.bias ")

    def test_logit(self):
        step = copy.deepcopy(self.step)
        _, T, V = step["logits"]["shape"]
        step["logits"]["value"][(1 * T + 7) * V + 11] += 1e-9
        text = self.assert_fails_naming(step, "logits", "logits ")
        self.assertIn("batch 1, position 7, token 11", text)

    def test_loss(self):
        step = copy.deepcopy(self.step)
        step["loss"] *= 1 + 1e-9
        self.assert_fails_naming(step, "loss", "loss: ")

    def test_missing_logits(self):
        step = copy.deepcopy(self.step)
        del step["logits"]
        self.assert_fails_naming(step, "logits", "logits: ")

    def test_command_line_exit_status(self):
        step = copy.deepcopy(self.step)
        self.param(step, "head.lm.weight")["grad"][0] += 1e-6
        path = os.path.join(self.tmp.name, "mutated.json")
        with open(path, "w") as f:
            json.dump(step, f)
        run = subprocess.run([sys.executable, str(SCRIPT), "--step", path], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("failed: head.lm.weight", run.stdout)


def main():
    global EXPORTER
    argv = sys.argv[:1]
    args = iter(sys.argv[1:])
    for arg in args:
        if arg == "--exporter":
            EXPORTER = next(args)
        else:
            argv.append(arg)
    if EXPORTER is None:
        EXPORTER = str(TOOLS.parent / "build" / "bin" / "dtp-export-step")
    result = unittest.main(argv=argv, exit=False).result
    if not result.wasSuccessful():
        return 1
    if not HAVE_TORCH:
        print("torch not installed: skipped (only the skip message was checked)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
