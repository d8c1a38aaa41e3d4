"""`dpfl run CONFIG.toml` and `dpfl demo` (filled in by the simulator work)."""


def configure(commands) -> None:
    pass
