"""trainwise: predict, plan, train and measure transformer training configurations."""

__version__ = "0.1.0"
