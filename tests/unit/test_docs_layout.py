"""The docs match the tree: docs/architecture.md's module map names every module of the project where it lives, the
README's layout section names the top-level folders there are, and every file path the docs give exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = ("schemas", "streamdi", "jobs")  # folders whose every module the map must name
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md")))
NOT_IN_GIT = ("docker/.env", "bench/out/")  # made by the user from docker/.env.example; by bench runs
SECTION = re.compile(r"\s((?:streamdi|jobs|schemas|dags|bench)(?:/\w+)*/)(?:\s|$)")
PATH = re.compile(r"(?<![\w/.-])((?:streamdi|jobs|schemas|dags|bench|tests|docker|expectations|docs)/[\w/.-]*\w)")


def module_map() -> dict[str, set[str]]:
    """Folder -> the file names its section of the map names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    sections: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        start = SECTION.search(line)
        if start:
            current = start.group(1).rstrip("/")
            sections.setdefault(current, set())
        if current:
            sections[current].update(re.findall(r"\b\w+\.py\b", line))
    return sections


def test_the_module_map_names_every_module_where_it_lives():
    sections = module_map()
    assert {"streamdi/run", "jobs", "jobs/audit", "streamdi", "schemas"} <= set(sections)
    unnamed, missing = [], []
    for folder, names in sections.items():
        here = ROOT / folder
        assert here.is_dir(), folder
        # A folder's own files and those of subfolders without a section of their own (e.g. streamdi/run/cli/).
        files = [
            p
            for p in here.rglob("*.py")
            if not any(
                str(p.parent.relative_to(ROOT)).startswith(s) and s != folder and s.startswith(folder) for s in sections
            )
        ]
        if folder.split("/")[0] in MAPPED:
            unnamed += [
                str(p.relative_to(ROOT))
                for p in files
                if p.name not in names
                and p.name != "__main__.py"
                and not (p.name == "__init__.py" and p.parent == here)
            ]
        missing += [f"{folder}/{name}" for name in names if not any(p.name == name for p in files)]
    assert unnamed == []
    assert missing == []
    covered = {s.split("/")[0] for s in sections}
    assert set(MAPPED) <= covered


def test_the_readme_layout_names_the_top_level_folders():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    named = {m.group(1) for m in re.finditer(r"^(\w[\w-]*)/", block, re.M)}
    made_here = {"test-artifacts", "build", "dist", "__pycache__"}  # made by runs and builds, not in git
    folders = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in made_here and not p.name.endswith(".egg-info")
    }
    assert named == folders


def test_every_path_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                if "*" not in path and not path.startswith(NOT_IN_GIT) and not (ROOT / path).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{number}: {path}")
    assert missing == []
