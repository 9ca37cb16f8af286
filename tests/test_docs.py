"""The documentation against the code: the command lines in the fenced code blocks of README.md
and docs/*.md name only options their parsers have and only files of data/ and configs/ that
exist; relative links and their anchors lead somewhere; the README's set-up is the Makefile's
two targets.

A command line is ``python translate.py ...`` (also after ``torchrun ...``), ``python -m onmt_lite
COMMAND ...``, ``onmt_lite_COMMAND ...`` or ``python benchmarks/NAME.py ...``. Only the flags are
checked, not their values, so placeholders such as MODEL.pt or SRC pass. Variables set in a block
(``B="python benchmarks/translate_bench.py ..."``) are expanded in its later lines."""
import argparse
import importlib
import importlib.util
import re
import shlex
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = ("translate", "train", "evaluate", "convert", "plot", "serve")
CHECKED_PATHS = re.compile(r"(?<![\w./~$-])(?:data|configs)/[\w.\-/]+")
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&", "&>"}
NUMBER = re.compile(r"-\.?\d")


def code_blocks(text: str):
    """(first line number, lines) of each fenced code block."""
    blocks, current, fence, start = [], None, None, 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if current is None:
            match = re.match(r"(`{3,}|~{3,})", stripped)
            if match:
                current, fence, start = [], match.group(1), number + 1
        elif stripped.startswith(fence) and stripped.strip(fence[0]) == "":
            blocks.append((start, current))
            current = None
        else:
            current.append(line)
    return blocks


def outside_fences(text: str):
    """The lines of ``text`` outside fenced code blocks."""
    inside, fence = False, None
    for line in text.splitlines():
        stripped = line.strip()
        match = re.match(r"(`{3,}|~{3,})", stripped)
        if not inside and match:
            inside, fence = True, match.group(1)
        elif inside and stripped.startswith(fence) and stripped.strip(fence[0]) == "":
            inside = False
        elif not inside:
            yield line


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in outside_fences(text))


def command_lines(start: int, lines):
    """(line number, text) of each shell line of a block: continuations joined, the block's
    variables expanded."""
    variables, joined, first = {}, "", None
    for number, line in enumerate(lines, start):
        first = number if first is None else first
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        text = re.sub(r"\$(\w+)|\$\{(\w+)\}",
                      lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), joined)
        assignment = re.fullmatch(r"\s*([A-Za-z_]\w*)=(.*)", text)
        if assignment:
            try:
                value = shlex.split(assignment.group(2), comments=True)
            except ValueError:
                value = []
            variables[assignment.group(1)] = " ".join(value)
        else:
            yield first, text
        joined, first = "", None


def tokens_of(text: str):
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def invocations(text: str):
    """(program, arguments) of each command of ours in a shell line; program is a command name
    of COMMANDS, "onmt_lite" (python -m onmt_lite with no command) or a benchmarks/ script."""
    try:
        tokens = tokens_of(text)
    except ValueError:  # an unbalanced quote: not a shell line
        return
    segment = []
    for token in tokens + [";"]:
        if token not in SEPARATORS:
            segment.append(token)
            continue
        found = _program(segment)
        if found:
            yield found
        segment = []


def _program(tokens):
    for i, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1]
        if name == "translate.py":
            return "translate", _arguments(tokens[i + 1:])
        match = re.fullmatch(r"onmt_lite_(\w+)", name)
        if match and match.group(1) in COMMANDS:
            return match.group(1), _arguments(tokens[i + 1:])
        if token == "-m" and tokens[i + 1:i + 2] == ["onmt_lite"] or (
                i == 0 and token == "onmt_lite"):
            rest = tokens[i + 2:] if token == "-m" else tokens[i + 1:]
            if rest and rest[0] in COMMANDS:
                return rest[0], _arguments(rest[1:])
            return "onmt_lite", _arguments(rest)
        if re.fullmatch(r"(\./)?benchmarks/\w+\.py", token):
            return token.removeprefix("./"), _arguments(tokens[i + 1:])
    return None


def _arguments(tokens):
    """The arguments up to the line's redirections."""
    kept = []
    for token in tokens:
        if token in REDIRECTIONS:
            if kept and kept[-1].isdigit():  # 2>
                kept.pop()
            break
        kept.append(token)
    return kept


_parsers = {}


class _Parsed(Exception):
    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def parser_of(program: str) -> argparse.ArgumentParser:
    if program not in _parsers:
        if program == "onmt_lite":  # python -m onmt_lite -h: the command list
            parser = argparse.ArgumentParser(prog="python -m onmt_lite")
        elif program == "serve":  # its own options, then translate.py's as the model's defaults
            parser = importlib.import_module("onmt_lite.cli.serve").build_parser()
            translate = importlib.import_module("onmt_lite.cli.translate").build_parser()
            for action in translate._actions:
                if not any(o in parser._option_string_actions for o in action.option_strings):
                    parser._add_action(action)
        elif program in COMMANDS:
            parser = importlib.import_module(f"onmt_lite.cli.{program}").build_parser()
        else:  # a benchmark script: the parser its main() builds, caught at parse_args
            path = ROOT / program
            spec = importlib.util.spec_from_file_location(f"_docs_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)

            def caught(self, *args, **kwargs):
                raise _Parsed(self)

            with mock.patch.object(argparse.ArgumentParser, "parse_args", caught):
                try:
                    module.main([])
                except _Parsed as parsed:
                    parser = parsed.parser
                else:
                    raise AssertionError(f"{program}: main() parsed no arguments")
        _parsers[program] = parser
    return _parsers[program]


def problems_in(text: str, where: str = "<text>"):
    """What is wrong with the command lines of a page's fenced blocks; also the number of
    command lines checked."""
    problems, checked = [], 0
    for start, lines in code_blocks(text):
        for number, line in command_lines(start, lines):
            for program, arguments in invocations(line):
                checked += 1
                label = f"{where}:{number}: {program}"
                if program.startswith("benchmarks/") and not (ROOT / program).is_file():
                    problems.append(f"{label}: no such script")
                    continue
                options = parser_of(program)._option_string_actions
                for argument in arguments:
                    flag = argument.startswith("-") and argument != "-" \
                        and not NUMBER.match(argument)
                    name, _, value = argument.partition("=") if flag else ("", "", argument)
                    if flag and name not in options:
                        problems.append(f"{label}: no option {name}")
                    for path in CHECKED_PATHS.findall(value):
                        if not (ROOT / path).exists():
                            problems.append(f"{label}: no file {path}")
    return problems, checked


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path):
    """The anchors of a page's headings, as GitHub numbers repeated ones."""
    headings = []
    for line in outside_fences(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            headings.append(heading.group(1))
    seen, result = {}, set()
    for heading in headings:
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def link_problems(path: Path):
    problems = []
    text = path.read_text(encoding="utf-8")
    body = "\n".join(re.sub(r"`[^`]*`", "", line) for line in
                     prose(text).splitlines())  # links in code are not links
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{path.name}: link to {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{path.name}: link to {target}: no such heading")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_commands_name_existing_options_and_files(page):
    problems, _ = problems_in(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix())
    assert problems == []


def test_the_commands_are_found():
    """The extraction finds the pages' commands: every command of onmt_lite is shown."""
    programs, total = set(), 0
    for page in PAGES:
        for start, lines in code_blocks(page.read_text(encoding="utf-8")):
            for _, line in command_lines(start, lines):
                for program, _ in invocations(line):
                    programs.add(program)
                    total += 1
    assert set(COMMANDS) <= programs and "benchmarks/translate_bench.py" in programs
    assert total >= 40


@pytest.mark.parametrize("block, problem", [
    ("python translate.py -model MODEL.pt -src SRC -no_such_option 3",
     "translate: no option -no_such_option"),
    ("python translate.py -model M.pt \\\n    -src SRC --beam_sizes 5", "no option --beam_sizes"),
    ("echo a | python translate.py -model data/no_such_model.pt -src - -output -",
     "no file data/no_such_model.pt"),
    ("python -m onmt_lite evaluate -hyp OUT -ref REF -tokenise none", "evaluate: no option -tokenise"),
    ("onmt_lite_train -config configs/no_such.yaml", "no file configs/no_such.yaml"),
    ('B="python benchmarks/translate_bench.py -threads 1"\n$B -model M -engine workers',
     "benchmarks/translate_bench.py: no option -engine"),
    ("torchrun --nproc_per_node 2 translate.py -model M.pt -workerz 2", "no option -workerz"),
])
def test_a_wrong_option_or_path_is_found(block, problem):
    problems, checked = problems_in(f"```\n{block}\n```\n")
    assert checked == 1 and len(problems) == 1 and problem in problems[0]


def test_flags_are_checked_not_values():
    block = ("python translate.py -model MODEL.pt -src - -output OUT -alpha -0.5 "
             "-config configs/beam5_wu.yaml 2> log.txt   # -not_an_option in a comment\n"
             "python -m onmt_lite -h\n"
             "-compile: no C++ compiler found (a log line, not a command)")
    assert problems_in(f"```\n{block}\n```\n") == ([], 2)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_lead_somewhere(page):
    assert link_problems(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"(docs/{page.name}" in readme, page.name


def test_the_set_up_is_the_two_make_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Set-up[^\n]*\n(.*?)(?=^## )", readme, re.M | re.S)
    assert section, "README has no '## Set-up' section"
    blocks = code_blocks(section.group(1))
    assert blocks, "the set-up section has no code block"
    assert [line.strip() for line in blocks[0][1] if line.strip()] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)
    assert phony and {"demo", "test"} <= set(phony.group(1).split())
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "data/demo.en" in demo and "data/multi30k_en_de_raw.pt" in demo
    test = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "pytest" in test
