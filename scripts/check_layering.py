#!/usr/bin/env python3
"""Fails when a source file includes a library its layer may not use.

The layers (docs/architecture.md); each may include itself and those listed:

  base              nothing of ours
  kernels/api       base
  kernels/cpu       base, kernels/api
  kernels/cuda      base, kernels/api     (its tests also kernels/cpu, the oracle)
  text              base
  proto/model       base, kernels/api     (a model folder's config.json)
  proto/plan        base, kernels/api, proto (the plan and its wire form)
  services          base, kernels/api, text, proto (all of it)
  workers           base, kernels, text, proto (all of it)
  services/offline  everything above      (services and workers in one process)
  bench             everything
  tests/fuzz        everything (the libFuzzer harnesses, and services' test walk)

Generated protobuf headers ("chunkattn/...pb.h", and the vLLM engine API's
"vllm/..." and "smg/...") are the proto layer.

Within services, each public API's front (services/fronts/<front>/) includes
no other front: they share only the coordinator (services/coordinator/) and
the files directly in services/fronts/ (generate_stream.h), which include no
front.

Link edges too (--build DIR): CMake's target graph (`cmake --graphviz`) must
follow the same layers: a target defined under one layer's folder may link
only targets of the layers it may include (test and fuzz executables are
exempt: their includes are checked). And the paper's core stays plain C++:
the targets in PURE may not reach gRPC or protobuf through any chain of
links (a stray PUBLIC link drags both into every user).

  scripts/check_layering.py [ROOT] [--build DIR | --graph DOT]   exit 0 when clean, 1 listing each bad edge
"""
import os
import re
import subprocess
import sys
import tempfile

SOURCE_EXTENSIONS = ('.h', '.cc', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# Layer of a file or include path: the longest matching prefix.
LAYERS = [
    'base', 'kernels/api', 'kernels/cpu', 'kernels/cuda/tests', 'kernels/cuda', 'kernels/tests', 'text',
    'proto/model', 'proto/plan', 'proto', 'services/offline', 'services', 'workers', 'bench', 'tests/fuzz',
]
KERNELS = {'kernels/api', 'kernels/cpu', 'kernels/cuda'}
PROTO = {'proto', 'proto/model', 'proto/plan'}
ALLOWED = {
    'base': set(),
    'kernels/api': {'base'},
    'kernels/cpu': {'base', 'kernels/api'},
    'kernels/cuda': {'base', 'kernels/api'},
    'kernels/cuda/tests': {'base', 'kernels/api', 'kernels/cpu', 'kernels/cuda', 'kernels/tests'},
    'kernels/tests': {'base'} | KERNELS,
    'text': {'base'},
    'proto/model': {'base', 'kernels/api'},
    'proto/plan': {'base', 'kernels/api', 'proto'},
    'proto': set(),
    'services': {'base', 'kernels/api', 'text'} | PROTO,
    'workers': {'base', 'text'} | PROTO | KERNELS,
    'services/offline': {'base', 'text', 'services', 'workers'} | PROTO | KERNELS,
    'bench': {'base', 'text', 'services', 'services/offline', 'workers'} | PROTO | KERNELS,
    'tests/fuzz': {'base', 'text', 'services', 'services/offline', 'workers'} | PROTO | KERNELS,
}


def layer_of(path):
    """The layer a repository-relative path (or include path) belongs to, or None."""
    if path.startswith(('chunkattn/', 'vllm/', 'smg/')):  # generated from proto/
        return 'proto'
    for layer in sorted(LAYERS, key=len, reverse=True):
        if path == layer or path.startswith(layer + '/'):
            return layer
    return None


FRONTS = 'services/fronts/'


def front_of(path):
    """The front a path is in: its folder under services/fronts/, '' for a file
    directly in services/fronts/ (shared by the fronts), None elsewhere."""
    if not path.startswith(FRONTS):
        return None
    rest = path[len(FRONTS):]
    return rest.split('/')[0] if '/' in rest else ''


def violations(root):
    """(file, line number, included path, why) for every forbidden include under root."""
    found = []
    for top in sorted({l.split('/')[0] for l in LAYERS}):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXTENSIONS):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, '/')
                src = layer_of(rel)
                if src is None:
                    continue
                with open(full, encoding='utf-8', errors='replace') as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        src_front, dst_front = front_of(rel), front_of(m.group(1))
                        if src_front is not None and dst_front and dst_front != src_front:
                            who = FRONTS + src_front if src_front else rel
                            found.append((rel, number, m.group(1), f'{who} may not include {FRONTS}{dst_front}'))
                            continue
                        dst = layer_of(m.group(1))
                        if dst is None or dst == src or dst in ALLOWED[src]:
                            continue
                        # A layer's tests may use its own layer's other parts.
                        if src.endswith('/tests') and dst == src[:-len('/tests')]:
                            continue
                        found.append((rel, number, m.group(1), f'{src} may not include {dst}'))
    return found


# Targets that must not reach gRPC or protobuf, by any chain of links.
PURE = ['chunkattn_kernels_api', 'chunkattn_kernels_cpu', 'chunkattn_cache', 'chunkattn_scheduler',
        'chunkattn_plan', 'chunkattn_text']
WIRE = re.compile(r'^(gRPC::|protobuf::|chunkattn_proto$)')
TARGET = re.compile(r'^\s*(add_library|add_executable|chunkattn_test|chunkattn_fuzzer)\(\s*([A-Za-z0-9_.+-]+)', re.M)
EDGE = re.compile(r'^\s*"node\d+" -> "node\d+".*// (\S+) -> (\S+)\s*$')


def defined_targets(root):
    """{target: (layer, exempt)} from every CMakeLists.txt under the layers' folders."""
    targets = {}
    for top in sorted({l.split('/')[0] for l in LAYERS}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            if 'CMakeLists.txt' not in filenames:
                continue
            rel = os.path.relpath(dirpath, root).replace(os.sep, '/')
            layer = layer_of(rel + '/CMakeLists.txt')
            if layer is None:
                continue
            with open(os.path.join(dirpath, 'CMakeLists.txt'), encoding='utf-8') as f:
                for kind, name in TARGET.findall(f.read()):
                    if kind == 'chunkattn_fuzzer':
                        name = 'chunkattn-fuzz-' + name
                    exempt = kind in ('chunkattn_test', 'chunkattn_fuzzer') or name.endswith('_test')
                    targets[name] = (layer, exempt, front_of(rel + '/CMakeLists.txt'))
    return targets


def link_edges(dot_text):
    """(target, dependency) for every link edge of a `cmake --graphviz` file."""
    edges = []
    for line in dot_text.splitlines():
        m = EDGE.match(line)
        if m:
            edges.append((m.group(1), m.group(2)))
    return edges


def link_violations(root, edges):
    """(target, dependency, why) for every forbidden link edge."""
    targets = defined_targets(root)
    found = []
    deps = {}
    for src, dst in edges:
        deps.setdefault(src, []).append(dst)
        if src not in targets or dst not in targets:
            continue
        (src_layer, exempt, src_front), (dst_layer, _, dst_front) = targets[src], targets[dst]
        if exempt:
            continue
        if dst_front and src_front is not None and src_front != dst_front:
            found.append((src, dst, f'{FRONTS}{src_front or "*"} may not link {FRONTS}{dst_front}'))
            continue
        if dst_layer == src_layer or dst_layer in ALLOWED.get(src_layer, set()):
            continue
        found.append((src, dst, f'{src_layer} may not link {dst_layer}'))
    for pure in PURE:
        # Breadth-first over the links, remembering how each target was reached.
        seen = {pure: None}
        queue = [pure]
        while queue:
            at = queue.pop(0)
            for nxt in deps.get(at, []):
                if nxt in seen:
                    continue
                seen[nxt] = at
                if WIRE.match(nxt):
                    chain = [nxt]
                    while seen[chain[-1]] is not None:
                        chain.append(seen[chain[-1]])
                    found.append((pure, nxt, 'plain C++ links the wire: ' + ' -> '.join(reversed(chain))))
                    queue = []
                    break
                queue.append(nxt)
    return found


def graph_of(build):
    """The link edges of the configured build folder `build`."""
    with tempfile.TemporaryDirectory(prefix='chunkattn-graph-') as tmp:
        dot = os.path.join(tmp, 'targets.dot')
        subprocess.run(['cmake', f'--graphviz={dot}', '.'], cwd=build, check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
        with open(dot, encoding='utf-8') as f:
            return link_edges(f.read())


def main(argv):
    args = argv[1:]
    build = None
    if '--build' in args:
        i = args.index('--build')
        build = args[i + 1]
        del args[i:i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    bad = violations(root)
    for rel, number, inc, why in bad:
        print(f'{rel}:{number}: #include "{inc}": {why}')
    graph = None
    if '--graph' in args:  # a `cmake --graphviz` file already made (the checker's own tests)
        i = args.index('--graph')
        with open(args[i + 1], encoding='utf-8') as f:
            graph = link_edges(f.read())
        del args[i:i + 2]
    root = args[0] if args else root
    if build:
        graph = graph_of(build)
    bad_links = link_violations(root, graph) if graph is not None else []
    for src, dst, why in bad_links:
        print(f'link {src} -> {dst}: {why}')
    if bad or bad_links:
        print(f'{len(bad)} forbidden include edge(s), {len(bad_links)} forbidden link edge(s); '
              'see scripts/check_layering.py for the layers')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
