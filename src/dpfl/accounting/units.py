"""The unit of privacy an algorithm protects: what two neighbouring data sets differ in.

Record-level DP protects one record of one client (most families here); user-level DP protects a client's whole data
(every record of one client changed at once, replaced by any others or removed, as the family's neighbouring relation
says: projected noisy SGD over users, Asoodeh et al. 2021; dp-fedavg-user; dp-ftrl). The ledger
composes the same events either way; what changes is what a neighbouring data set is, so the report says which (an
algorithm's ``privacy_unit``), and the audit plants a canary of that size (``dpfl.audit.runs``).
"""

RECORD_LEVEL = "one record (record-level DP)"
USER_LEVEL = ("one client's data (user-level DP: every record of one client changed at once; privacy.neighboring says "
              "how: replaced by any others, or removed)")

__all__ = ["RECORD_LEVEL", "USER_LEVEL"]
