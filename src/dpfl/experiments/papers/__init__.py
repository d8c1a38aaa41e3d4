"""Papers' experiments, one module per paper: its tables and figures, reproduced with dpfl."""
