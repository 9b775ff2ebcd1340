

def demo() -> None:
    """stub"""
