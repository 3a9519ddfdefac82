#!/usr/bin/env python3
"""Fails when a source file includes a library its layer may not use.

The layers (README "Architecture"); each may include itself and those listed:

  base         nothing of ours
  kernels/api  base
  kernels/cpu  base, kernels/api
  kernels/cuda base, kernels/api          (its tests also kernels/cpu, the oracle)
  text         base
  config       base, kernels/api
  plan         base, kernels/api, proto  (its wire form)
  services     base, kernels/api, text, config, plan, proto
  workers      base, kernels, text, config, plan, proto
  engine       everything above         (services and workers together)
  bench        everything
  fuzz         everything (the libFuzzer harnesses, and services' test walk)

Generated protobuf headers ("chunkattn/...pb.h", and the vLLM engine API's
"vllm/..." and "smg/...") are the proto layer.

  scripts/check_layering.py [ROOT]   exit 0 when clean, 1 listing each bad edge
"""
import os
import re
import sys

SOURCE_EXTENSIONS = ('.h', '.cc', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# Layer of a file or include path: the longest matching prefix.
LAYERS = [
    'base', 'kernels/api', 'kernels/cpu', 'kernels/cuda/tests', 'kernels/cuda', 'kernels/tests', 'text',
    'config', 'plan', 'proto', 'services', 'workers', 'engine', 'bench', 'fuzz',
]
KERNELS = {'kernels/api', 'kernels/cpu', 'kernels/cuda'}
ALLOWED = {
    'base': set(),
    'kernels/api': {'base'},
    'kernels/cpu': {'base', 'kernels/api'},
    'kernels/cuda': {'base', 'kernels/api'},
    'kernels/cuda/tests': {'base', 'kernels/api', 'kernels/cpu', 'kernels/cuda', 'kernels/tests'},
    'kernels/tests': {'base'} | KERNELS,
    'text': {'base'},
    'config': {'base', 'kernels/api'},
    'plan': {'base', 'kernels/api', 'proto'},
    'proto': set(),
    'services': {'base', 'kernels/api', 'text', 'config', 'plan', 'proto'},
    'workers': {'base', 'text', 'config', 'plan', 'proto'} | KERNELS,
    'engine': {'base', 'text', 'config', 'plan', 'proto', 'services', 'workers'} | KERNELS,
    'bench': {'base', 'text', 'config', 'plan', 'proto', 'services', 'workers', 'engine'} | KERNELS,
    'fuzz': {'base', 'text', 'config', 'plan', 'proto', 'services', 'workers', 'engine'} | KERNELS,
}


def layer_of(path):
    """The layer a repository-relative path (or include path) belongs to, or None."""
    if path.startswith(('chunkattn/', 'vllm/', 'smg/')):  # generated from proto/
        return 'proto'
    for layer in sorted(LAYERS, key=len, reverse=True):
        if path == layer or path.startswith(layer + '/'):
            return layer
    return None


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
                        dst = layer_of(m.group(1))
                        if dst is None or dst == src or dst in ALLOWED[src]:
                            continue
                        # A layer's tests may use its own layer's other parts.
                        if src.endswith('/tests') and dst == src[:-len('/tests')]:
                            continue
                        found.append((rel, number, m.group(1), f'{src} may not include {dst}'))
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    bad = violations(root)
    for rel, number, inc, why in bad:
        print(f'{rel}:{number}: #include "{inc}": {why}')
    if bad:
        print(f'{len(bad)} forbidden include edge(s); see scripts/check_layering.py for the layers')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
