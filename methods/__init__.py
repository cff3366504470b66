"""Methods, one file each. Installed as solbench.methods; see solbench/method.py for the interface."""
