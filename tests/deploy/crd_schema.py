"""Custom resources checked against their CRDs' published schemas, as the API server would.

No npm (or Debian) package carries the LeaderWorkerSet or InferencePool schemas, so
tests/deploy/crd/ holds trimmed copies of the CRDs' openAPIV3Schema, each naming the file,
tag and commit it came from. `validate` checks an object against one the way a structural
schema is applied under strict field validation (kubectl's --validate=strict): types,
required fields, enums, bounds, patterns, int-or-string, unknown fields, and the list-map
keys' uniqueness. CEL rules (x-kubernetes-validations) cannot be evaluated here: they are
returned, so that a test names each one and checks it by hand.

Regenerate a copy:
  python3 tests/deploy/crd_schema.py CRD.yaml VERSION URL TAG COMMIT > tests/deploy/crd/NAME.yaml
"""
import json
import os
import re
import sys

import yaml

CRD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'crd')
INT32 = (-2 ** 31, 2 ** 31 - 1)


def load(name):
    """The schema in tests/deploy/crd/<name>.yaml."""
    with open(os.path.join(CRD_DIR, name + '.yaml')) as f:
        return yaml.safe_load(f)


def validate(obj, schema):
    """(errors, cel_rules): what the schema rejects in obj, as 'path: why' strings, and the
    CEL rules met on the way, as (path, rule) pairs."""
    errors, cel = [], []
    _check(obj, schema, schema, '', errors, cel)
    return errors, cel


def _resolve(node, root):
    while '$ref' in node:  # only the copies' own '#/definitions/<name>'
        node = root['definitions'][node['$ref'].rsplit('/', 1)[1]]
    return node


def _type_ok(value, t, int_or_string):
    if int_or_string:
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    return {
        'object': lambda v: isinstance(v, dict),
        'array': lambda v: isinstance(v, list),
        'string': lambda v: isinstance(v, str),
        'integer': lambda v: isinstance(v, int) and not isinstance(v, bool),
        'number': lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        'boolean': lambda v: isinstance(v, bool),
    }[t](value)


def _check(value, node, root, path, errors, cel):
    node = _resolve(node, root)
    where = path or '<root>'
    for rule in node.get('x-kubernetes-validations', []):
        cel.append((where, rule['rule']))
    int_or_string = node.get('x-kubernetes-int-or-string', False)
    if 'anyOf' in node and not int_or_string:
        def fails(alt):
            errs = []
            _check(value, alt, root, path, errs, [])
            return errs
        if all(fails(alt) for alt in node['anyOf']):
            errors.append('%s: %r matches none of %s' % (where, value, node['anyOf']))
            return
    t = node.get('type')
    if t and not _type_ok(value, t, int_or_string):
        errors.append('%s: %r is not of type %s' % (where, value, 'int-or-string' if int_or_string else t))
        return
    if 'enum' in node and value not in node['enum']:
        errors.append('%s: %r not in %s' % (where, value, node['enum']))
    if isinstance(value, str):
        if 'pattern' in node and not re.search(node['pattern'], value):
            errors.append('%s: %r does not match %s' % (where, value, node['pattern']))
        if len(value) > node.get('maxLength', len(value)) or len(value) < node.get('minLength', 0):
            errors.append('%s: %r has a length out of [%s, %s]' % (where, value, node.get('minLength'),
                                                                  node.get('maxLength')))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = node.get('minimum'), node.get('maximum')
        if node.get('format') == 'int32' and isinstance(value, int):
            low = INT32[0] if low is None else max(low, INT32[0])
            high = INT32[1] if high is None else min(high, INT32[1])
        if (low is not None and value < low) or (high is not None and value > high):
            errors.append('%s: %r out of [%s, %s]' % (where, value, low, high))
    if isinstance(value, dict):
        if not _within(len(value), node.get('minProperties'), node.get('maxProperties')):
            errors.append('%s: %d properties, out of [%s, %s]' % (where, len(value), node.get('minProperties'),
                                                                node.get('maxProperties')))
        for key in node.get('required', []):
            if key not in value:
                errors.append('%s: missing required field %r' % (where, key))
        props = node.get('properties')
        extra = node.get('additionalProperties')
        for key, item in value.items():
            sub = '%s.%s' % (path, key) if path else key
            if props is not None and key in props:
                _check(item, props[key], root, sub, errors, cel)
            elif isinstance(extra, dict):
                _check(item, extra, root, sub, errors, cel)
            elif props is not None and extra is not True and not node.get('x-kubernetes-preserve-unknown-fields'):
                errors.append('%s: unknown field' % sub)
    if isinstance(value, list):
        if not _within(len(value), node.get('minItems'), node.get('maxItems')):
            errors.append('%s: %d items, out of [%s, %s]' % (where, len(value), node.get('minItems'),
                                                            node.get('maxItems')))
        if 'items' in node:
            for i, item in enumerate(value):
                _check(item, node['items'], root, '%s[%d]' % (path, i), errors, cel)
        kind = node.get('x-kubernetes-list-type')
        if kind == 'map':
            keys = [tuple(json.dumps(item.get(k)) for k in node['x-kubernetes-list-map-keys'])
                    for item in value if isinstance(item, dict)]
            if len(keys) != len(set(keys)):
                errors.append('%s: duplicate entries by %s' % (where, node['x-kubernetes-list-map-keys']))
        elif kind == 'set':
            items = [json.dumps(item, sort_keys=True) for item in value]
            if len(items) != len(set(items)):
                errors.append('%s: duplicate items in a set' % where)


def _within(n, low, high):
    return (low is None or n >= low) and (high is None or n <= high)


def trim(crd, version):
    """The version's openAPIV3Schema without descriptions and status; large subtrees that are
    equal properties of one object (LWS's two pod templates) are kept once under definitions
    and referenced from both."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != 'description'}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    schema = [v for v in crd['spec']['versions'] if v['name'] == version][0]['schema']['openAPIV3Schema']
    schema = strip(schema)
    schema['properties'].pop('status', None)
    definitions = {}

    def dedup(node):
        if isinstance(node, list):
            for v in node:
                dedup(v)
        if not isinstance(node, dict):
            return
        props = node.get('properties')
        if isinstance(props, dict):
            groups = {}
            for key, sub in props.items():
                blob = json.dumps(sub, sort_keys=True)
                if len(blob) > 1000:
                    groups.setdefault(blob, []).append(key)
            for keys in groups.values():
                if len(keys) > 1:
                    assert keys[0] not in definitions, keys
                    definitions[keys[0]] = props[keys[0]]
                    for key in keys:
                        props[key] = {'$ref': '#/definitions/' + keys[0]}
        for v in node.values():
            dedup(v)
    dedup(schema)
    if definitions:
        schema['definitions'] = definitions
    return schema


def main(argv):
    path, version, url, tag, commit = argv
    with open(path) as f:
        crd = yaml.safe_load(f)
    schema = trim(crd, version)
    print('# %s %s/%s, from %s' % (crd['spec']['names']['kind'], crd['spec']['group'], version, url))
    print('# at tag %s (commit %s): spec.versions[%s].schema.openAPIV3Schema without its' % (tag, commit, version))
    print('# descriptions and status%s. Made by tests/deploy/crd_schema.py.' % (
        '; repeated subtrees kept once under definitions' if 'definitions' in schema else ''))
    sys.stdout.write(yaml.safe_dump(schema, sort_keys=True, default_flow_style=False, width=120))


if __name__ == '__main__':
    main(sys.argv[1:])
