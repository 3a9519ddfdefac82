#!/usr/bin/env python3
"""The README and docs/ name only what exists.

Checked in README.md and every docs/**/*.md page:
  - every repository path shown in backticks or a code block
    (`services/core/scheduler.h`, `scripts/serve_demo.sh`, `bench/`) exists;
    a path counts as one when its first folder is a top-level folder of the
    tree, or one of the folders the tree used to have (FORMER_TOP_DIRS);
  - every relative markdown link resolves inside the repository, and a
    #fragment into a markdown page names one of its headings;
  - every binary a command shows (`build/bin/X`, or X itself at the start of
    a command) is an add_executable(X ...) target of some CMakeLists.txt, and
    every --flag after it is an ABSL_FLAG of its sources (or of a library:
    a file that is no executable's source), dashes read as underscores;
  - the README stays short (MAX_README_LINES).

Not checked as paths: build outputs (build*/), placeholders (<machine>, *,
$VAR, ...), paths pinned to another repository's commit (path@commit), and
the research records in RESEARCH_RECORDS, which quote other repositories'
trees (their links are still checked).

  python3 tests/tools/test_readme.py   (stdlib only; no build needed)
"""
import os
import re
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
MAX_README_LINES = 180
# Top-level folders the reorganization removed: a page naming them is stale.
FORMER_TOP_DIRS = {'engine', 'config', 'plan'}
RESEARCH_RECORDS = {'docs/design/issue-24-research.md'}
# absl's own flags, defined in absl, not in our sources.
ABSL_BUILTIN_FLAGS = {'help', 'helpfull', 'helpshort', 'helppackage', 'helpon', 'helpmatch', 'version',
                      'only_check_args', 'flagfile', 'fromenv', 'tryfromenv', 'undefok'}
SOURCE_EXTENSIONS = ('.cc', '.h', '.cu', '.cuh')

FENCE = re.compile(r'^\s*(```|~~~)')
INLINE_CODE = re.compile(r'(`+)((?:(?!\1).)+?)\1', re.S)
LINK = re.compile(r'!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
LINK_DEFINITION = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$', re.M)
PLACEHOLDER = re.compile(r'[<>*$%@…]|\.\.\.')
ADD_EXECUTABLE = re.compile(r'add_executable\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)', re.S)
ABSL_FLAG = re.compile(r'ABSL_FLAG\(\s*[^,]+?,\s*(\w+)\s*,', re.S)
FLAG = re.compile(r'(?<![\w-])--([A-Za-z][A-Za-z0-9_-]*)')
BINARY = re.compile(r'(?<![\w./-])build/bin/([A-Za-z0-9_.+-]+)')
SHELL_BREAK = re.compile(r'\s(?:\|\|?|&&?|;|#)(?=\s|$)')


def skipped_dir(name):
    """Build outputs, hidden folders and installed packages: not the tree's sources."""
    return name.startswith(('.', 'build')) or name in ('node_modules', '__pycache__')


def doc_pages(root):
    """README.md and docs/**/*.md, repository-relative, sorted."""
    pages = ['README.md'] if os.path.isfile(os.path.join(root, 'README.md')) else []
    docs = os.path.join(root, 'docs')
    for dirpath, dirnames, filenames in os.walk(docs):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith('.md'):
                pages.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, '/'))
    return pages


def split_code(text):
    """(prose, blocks): prose is `text` with fenced blocks blanked (line numbers
    kept); blocks is [(first line number, block text)]."""
    prose, blocks, block, start, fence = [], [], [], 0, None
    for number, line in enumerate(text.split('\n'), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence, start, block = m.group(1), number + 1, []
            prose.append('')
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((start, '\n'.join(block)))
            fence = None
            prose.append('')
        elif fence is not None:
            block.append(line)
            prose.append('')
        else:
            prose.append(line)
    if fence is not None:  # an unclosed fence runs to the end
        blocks.append((start, '\n'.join(block)))
    return '\n'.join(prose), blocks


def code_spans(text):
    """[(line number, code)]: every inline code span and fenced block."""
    prose, blocks = split_code(text)
    spans = []
    for m in INLINE_CODE.finditer(prose):
        if '\n\n' in m.group(2):  # a stray backtick, not a span across paragraphs
            continue
        spans.append((prose.count('\n', 0, m.start()) + 1, m.group(2)))
    return spans + blocks


def expand_braces(word):
    """services/{a,b}.h -> [services/a.h, services/b.h] (one level per brace pair, nested ok)."""
    m = re.search(r'\{([^{}]*)\}', word)
    if not m:
        return [word]
    out = []
    for choice in m.group(1).split(','):
        out.extend(expand_braces(word[:m.start()] + choice + word[m.end():]))
    return out


def top_dirs(root):
    return {name for name in os.listdir(root)
            if os.path.isdir(os.path.join(root, name)) and not name.startswith(('.', 'build'))} | FORMER_TOP_DIRS


def path_words(code, tops):
    """The repository paths a code span or block names."""
    found = []
    for word in code.split():
        if '://' in word:
            continue
        word = word.split('=')[-1].strip('"\'`()[],;.:')
        if '/' not in word or word.startswith('/') or PLACEHOLDER.search(word):
            continue
        word = re.sub(r'[:#].*$', '', word)  # file:line, file#anchor, file::Function
        if word.split('/')[0] not in tops:
            continue
        found.extend(expand_braces(word))
    return found


def commands(code):
    """[(line offset, logical line)] of a code span or block: backslash continuations joined."""
    out, pending, start = [], [], 0
    for offset, line in enumerate(code.split('\n')):
        if not pending:
            start = offset
        if line.endswith('\\'):
            pending.append(line[:-1])
            continue
        out.append((start, ' '.join(pending + [line])))
        pending = []
    if pending:
        out.append((start, ' '.join(pending)))
    return out


def cmake_executables(root):
    """{target: [source paths]} from every CMakeLists.txt outside build folders."""
    targets = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not skipped_dir(d))
        if 'CMakeLists.txt' not in filenames:
            continue
        with open(os.path.join(dirpath, 'CMakeLists.txt'), encoding='utf-8', errors='replace') as f:
            text = re.sub(r'#[^\n]*', '', f.read())
        for m in ADD_EXECUTABLE.finditer(text):
            if '$' in m.group(1):
                continue
            sources = [os.path.normpath(os.path.join(dirpath, s)) for s in m.group(2).split()
                       if s.endswith(SOURCE_EXTENSIONS) and '$' not in s]
            targets.setdefault(m.group(1), []).extend(sources)
    return targets


def absl_flags(root):
    """{absolute source path: {flag names}} for every source defining an ABSL_FLAG."""
    flags = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not skipped_dir(d))
        for name in filenames:
            if not name.endswith(SOURCE_EXTENSIONS):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding='utf-8', errors='replace') as f:
                names = set(ABSL_FLAG.findall(f.read()))
            if names:
                flags[os.path.normpath(path)] = names
    return flags


def github_anchors(page_text):
    """The #fragments GitHub gives a page's headings."""
    anchors, seen = set(), {}
    prose, _ = split_code(page_text)
    for line in prose.split('\n'):
        m = re.match(r'^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', m.group(1)).replace('`', '').lower()
        slug = re.sub(r'[^\w\- ]', '', text).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f'{slug}-{n}')
    return anchors


def problems(root):
    """Every broken path, link, binary and flag of the root's README and docs, as messages."""
    root = os.path.abspath(root)
    tops = top_dirs(root)
    executables = cmake_executables(root)
    flags_by_file = absl_flags(root)
    executable_sources = {s for sources in executables.values() for s in sources}
    library_flags = set().union(*[f for p, f in flags_by_file.items() if p not in executable_sources])
    found = []
    for page in doc_pages(root):
        with open(os.path.join(root, page), encoding='utf-8') as f:
            text = f.read()
        if page == 'README.md' and text.count('\n') > MAX_README_LINES:
            found.append(f'README.md: {text.count(chr(10))} lines, over {MAX_README_LINES}: move detail into docs/')
        for line, code in code_spans(text):
            if page not in RESEARCH_RECORDS:
                for offset, code_line in enumerate(code.split('\n')):
                    for path in path_words(code_line, tops):
                        if not os.path.exists(os.path.join(root, path)):
                            found.append(f'{page}:{line + offset}: `{path}` does not exist')
            for offset, command in commands(code):
                where = f'{page}:{line + offset}'
                for binary, rest in binaries_in(command, executables):
                    if binary not in executables:
                        found.append(f'{where}: build/bin/{binary} is no add_executable target')
                        continue
                    known = set(library_flags) | ABSL_BUILTIN_FLAGS
                    for source in executables[binary]:
                        known |= flags_by_file.get(source, set())
                    for flag in FLAG.findall(SHELL_BREAK.split(rest)[0]):
                        if flag.replace('-', '_') not in known:
                            found.append(f'{where}: {binary} has no flag --{flag}')
        found.extend(link_problems(root, page, text))
    return found


def binaries_in(command, executables):
    """[(binary, the rest of its command)]: build/bin/X anywhere, or a target named first."""
    out = [(m.group(1), command[m.end():]) for m in BINARY.finditer(command)]
    words = command.split()
    if not out and words and words[0] in executables:
        out.append((words[0], command.split(None, 1)[1] if len(words) > 1 else ''))
    return out


def link_problems(root, page, text):
    found = []
    prose, _ = split_code(text)
    prose = INLINE_CODE.sub(lambda m: ' ' * len(m.group(0)) if '\n\n' not in m.group(2) else m.group(0), prose)
    targets = [(m.start(), m.group(1)) for m in LINK.finditer(prose)]
    targets += [(m.start(), m.group(1)) for m in LINK_DEFINITION.finditer(prose)]
    page_dir = os.path.dirname(os.path.join(root, page))
    for offset, target in sorted(targets):
        where = f'{page}:{prose.count(chr(10), 0, offset) + 1}'
        if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # https:, mailto:
            continue
        path, _, fragment = target.partition('#')
        full = os.path.normpath(os.path.join(page_dir, path)) if path else os.path.join(root, page)
        if os.path.relpath(full, root).startswith('..'):
            found.append(f'{where}: link {target} leaves the repository')
            continue
        if not os.path.exists(full):
            found.append(f'{where}: link {target} does not resolve')
            continue
        if fragment and full.endswith('.md'):
            with open(full, encoding='utf-8') as f:
                if fragment.lower() not in github_anchors(f.read()):
                    found.append(f'{where}: link {target}: no heading #{fragment}')
    return found


class RepositoryDocsTest(unittest.TestCase):
    def test_readme_and_docs_name_only_what_exists(self):
        found = problems(ROOT)
        self.assertEqual(found, [], '\n' + '\n'.join(found))

    def test_docs_exist(self):
        pages = doc_pages(ROOT)
        self.assertIn('README.md', pages)
        self.assertIn('docs/README.md', pages)


class CheckerTest(unittest.TestCase):
    """The checker on small trees: clean passes, each kind of breakage is named."""

    GOOD = {
        'CMakeLists.txt': 'add_executable(tool tool/main.cc)  # the tool\n',
        'tool/main.cc': 'ABSL_FLAG(std::string, model_dir, "", "x");\nABSL_FLAG(int,\n    port, 0, "y");\n',
        'base/lib.cc': 'ABSL_FLAG(bool, verbose, false, "a library flag");\n',
        'scripts/run.sh': '',
        'docs/guide.md': '# The guide\n\n## Two words\n',
    }
    GOOD_README = ('# t\n\nRun `scripts/run.sh`, see [the guide](docs/guide.md#two-words) and `base/`.\n\n'
                   '```sh\nbuild/bin/tool --model-dir m \\\n    --port 1 --verbose | grep --count x\n'
                   'tool --help\n```\n\nNot paths: `build/demo-model`, `bench/results/x-<machine>.json`, '
                   '`http://h/x`, `/v1/models`, `fp16/bf16`.\n')

    def check(self, files):
        with tempfile.TemporaryDirectory(prefix='chunkattn-readme-') as root:
            for path, text in files.items():
                full = os.path.join(root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, 'w', encoding='utf-8') as f:
                    f.write(text)
            return problems(root)

    def test_clean_tree_passes(self):
        self.assertEqual(self.check({**self.GOOD, 'README.md': self.GOOD_README}), [])

    def test_missing_path_fails(self):
        found = self.check({**self.GOOD, 'README.md': '# t\n\nSee `scripts/gone.sh`.\n',
                            'docs/a.md': '```\nless base/{lib,gone}.cc\n```\n'})
        self.assertEqual(found, ['README.md:3: `scripts/gone.sh` does not exist',
                                 'docs/a.md:2: `base/gone.cc` does not exist'])

    def test_former_folder_fails(self):
        found = self.check({**self.GOOD, 'README.md': '`engine/local_engine.h`\n'})
        self.assertEqual(found, ['README.md:1: `engine/local_engine.h` does not exist'])

    def test_broken_links_fail(self):
        found = self.check({**self.GOOD, 'README.md': '[a](docs/none.md) [b](docs/guide.md#nope) [c](../out.md)\n'})
        self.assertEqual(found, ['README.md:1: link docs/none.md does not resolve',
                                 'README.md:1: link docs/guide.md#nope: no heading #nope',
                                 'README.md:1: link ../out.md leaves the repository'])

    def test_unknown_binary_and_flag_fail(self):
        found = self.check({**self.GOOD, 'README.md': '`build/bin/nothing --x`\n\n```\nbuild/bin/tool --nope\n```\n'})
        self.assertEqual(found, ['README.md:1: build/bin/nothing is no add_executable target',
                                 'README.md:4: tool has no flag --nope'])

    def test_lines_inside_a_block_are_named(self):
        found = self.check({**self.GOOD, 'README.md': '```sh\nbuild/bin/tool --port 1 \\\n    --nope\nless scripts/none.sh\n```\n'})
        self.assertEqual(found, ['README.md:4: `scripts/none.sh` does not exist',
                                 'README.md:2: tool has no flag --nope'])

    def test_long_readme_fails(self):
        found = self.check({**self.GOOD, 'README.md': 'x\n' * (MAX_README_LINES + 1)})
        self.assertEqual(len(found), 1)
        self.assertIn('over 180', found[0])


if __name__ == '__main__':
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:])
