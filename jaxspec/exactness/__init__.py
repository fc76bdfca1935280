"""The exactness harness: does a decoder configuration reproduce the target's law?

:func:`verify` (:mod:`~jaxspec.exactness.harness`) samples the real decoder and tests it
against the exact law (:mod:`~jaxspec.exactness.exact_laws`), counted in streamed chunks
(:mod:`~jaxspec.exactness.sample_counts`), with the statistics of
:mod:`~jaxspec.exactness.stats`, reported by :class:`VerifyReport`
(:mod:`~jaxspec.exactness.report`); :mod:`~jaxspec.exactness.mutants` are decoders broken on
purpose, to show the harness rejects them; :mod:`~jaxspec.exactness.rule_laws` enumerates the
exact laws of the verification rules on small bigram tables (float64, no sampling). Without
enumeration, at any vocabulary: the conditional PIT (:mod:`~jaxspec.exactness.pit`), hashed
cells (:mod:`~jaxspec.exactness.hashed`), and both on a decoder written elsewhere
(:mod:`~jaxspec.exactness.external`); :func:`verify` runs the first two itself where the
law is too large to enumerate (:mod:`~jaxspec.exactness.sampled`, a :class:`SampledReport`).

The package is ``jaxspec.exactness``, not ``jaxspec.verify``: ``jaxspec.verify`` is the
function.
"""

from jaxspec.exactness.exact_laws import ExactLaw, exact_law, expected_acceptance
from jaxspec.exactness.harness import (
    DEFAULT_PROMPT,
    DEFAULT_SCHEME,
    DEFAULT_TREE,
    default_pair,
    verify,
)
from jaxspec.exactness.external import SamplerReport, check_sampler
from jaxspec.exactness.hashed import hash_cells, hashed_tests
from jaxspec.exactness.pit import pit_tests, pit_values
from jaxspec.exactness.report import TestResult, VerifyReport
from jaxspec.exactness.sampled_report import SampledReport

__all__ = [
    "DEFAULT_PROMPT", "DEFAULT_SCHEME", "DEFAULT_TREE", "ExactLaw", "SampledReport", "SamplerReport", "TestResult", "VerifyReport",
    "check_sampler", "default_pair", "exact_law", "expected_acceptance", "hash_cells", "hashed_tests", "pit_tests",
    "pit_values", "verify",
]
