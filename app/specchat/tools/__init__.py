"""Measuring code: the bench (``specchat bench``), the background CPU load it
runs beside, the window's lag probe. Tools drive the engine, the library and
the window from outside, so they may import every layer and no layer imports
them."""
