"""The unit of privacy an algorithm protects: what two neighbouring data sets differ in.

Record-level DP protects one record of one client (most families here); user-level DP protects a client's whole data
(every record of one client replaced by any others: projected noisy SGD over users, Asoodeh et al. 2021). The ledger
composes the same events either way; what changes is what a neighbouring data set is, so the report says which (an
algorithm's ``privacy_unit``), and the audit plants a canary of that size (``dpfl.audit.runs``).
"""

RECORD_LEVEL = "one record (record-level DP)"
USER_LEVEL = "one client's data (user-level DP: one client's records replaced by any others)"

__all__ = ["RECORD_LEVEL", "USER_LEVEL"]
