"""Privacy accounting: events, RDP/PLD accountants, what dp_accounting lacks, calibration, per-observer ledger."""
