"""One random edit of a JSON document (replace, delete or add a node): the fuzz of the /v1 and FHIR routes."""
from __future__ import annotations

from hypothesis import strategies as st

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


def mutate_json(data, draw):
    """Replaces, deletes or adds one node somewhere in a JSON document."""
    path = []
    node = data
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append((node, key))
        node = node[key]
    if not path:
        return draw(JUNK)
    parent, key = path[-1]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[key] = draw(JUNK)
    elif action == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(JUNK)
    else:
        parent.append(draw(JUNK))
    return data
