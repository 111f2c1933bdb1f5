"""The bottom layer's contact with other packages: every private name of verl, Ray, torch (and the other watched
packages) this package touches, and how it patches them (:mod:`ebpo_verl.compat.contact`)."""
