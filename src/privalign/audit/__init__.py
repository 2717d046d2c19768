"""privalign.audit: public statistical assertions and privacy audits.

* :mod:`privalign.audit.stats`: chi-square (with bin merging), KS, binomial tests and Clopper–Pearson
  intervals, each with a stated false-positive rate α and exact critical values.
* :mod:`privalign.audit.audit`: empirical ε lower bounds from samples on a neighbouring pair
  (:func:`audit_mechanism` for discrete outputs, :func:`audit_threshold` for real-valued ones).
* :mod:`privalign.audit.worst_case`: analytic worst-case pairs for the built-in mechanisms
  (:func:`audit_builtin`, used by ``privalign audit``).
* :mod:`privalign.audit.broken`: deliberately broken negative controls.

Guide with a worked example: ``docs/audit.md``.
"""

from privalign.audit.audit import AuditResult, audit_mechanism, audit_threshold, epsilon_lower_bound
from privalign.audit.stats import (
    StatisticalAssertionError,
    StatTestResult,
    assert_binomial,
    assert_chi_square,
    assert_ks,
    binomial_test,
    chi_square_test,
    clopper_pearson,
    ks_test,
    merge_bins,
)

__all__ = [
    "AuditResult",
    "StatTestResult",
    "StatisticalAssertionError",
    "assert_binomial",
    "assert_chi_square",
    "assert_ks",
    "audit_mechanism",
    "audit_threshold",
    "binomial_test",
    "chi_square_test",
    "clopper_pearson",
    "epsilon_lower_bound",
    "ks_test",
    "merge_bins",
]
