"""A Griffe extension for the API pages: RST roles in docstrings become Markdown code spans.

The docstrings are prose with RST markup; ``literals`` already read as Markdown code spans, and
this turns ``:func:`~nest.cost.evaluate``` into ```evaluate``` (``~``: the last name only) and
``:class:`nest.core.plan.Plan``` into ```nest.core.plan.Plan```, so no ``:role:`` is shown.
Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

import re

import griffe

ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]*?)(?:\s*<[^>]*>)?`")


def _span(match: re.Match) -> str:
    name = match.group(2).strip()
    if match.group(1):
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


def rst_roles_to_code(text: str) -> str:
    """``:role:`target``` -> ```target``` (``~`` keeps the last dotted name)."""
    return ROLE.sub(_span, text)


class RstRoles(griffe.Extension):
    """Rewrites every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_roles_to_code(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        """The package itself (``on_object`` runs for its members)."""
        self.on_object(obj=pkg)
