"""Sphinx configuration of jaxspec's API reference (autodoc + napoleon, Google-style docstrings).

Build (docs/DEVELOPMENT.md; CI runs it with warnings as errors):

    .venv/bin/pip install -e '.[docs]'
    .venv/bin/sphinx-build -W --keep-going -b html docs/api build/api
"""

import os

# autodoc imports jaxspec's modules; only the CPU is needed (and no accelerator is probed)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jaxspec  # noqa: E402

project = "jaxspec"
version = release = jaxspec.__version__
copyright = "jaxspec authors, Apache-2.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]

# the docstrings are Google style (Args: / Returns: / Attributes:) with reST inline markup
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Attributes: sections as fields of the class, not as separate entries (which would
# duplicate the dataclass and NamedTuple fields that autodoc lists itself)
napoleon_use_ivar = True
# the descriptions give the shapes and dtypes; the annotations (``jax.Array``) add nothing
napoleon_attr_annotations = False
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# every public name of jaxspec/__init__.py's _EXPORTS is documented once, as jaxspec.NAME
add_module_names = True

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    """A NamedTuple's fields are documented by its Attributes: section; skip the generated
    "Alias for field number k" entries."""
    doc = getattr(obj, "__doc__", None) or ""
    return True if doc.startswith("Alias for field number") else None


def setup(app):
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
