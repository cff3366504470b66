"""Methods, one file each. Installed as solbench.methods; see solbench/method/__init__.py for the interface."""
