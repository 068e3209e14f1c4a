"""Install machinery: what a recipe install is (:mod:`~sitestack.installs.target`), its inputs and
their digest (:mod:`~sitestack.installs.inputs`), the site toolchain (:mod:`~sitestack.installs.toolchain`),
the stamp and lock (:mod:`~sitestack.installs.stamp`), progress lines (:mod:`~sitestack.installs.progress`),
the install itself (:mod:`~sitestack.installs.installer`) and the source cache (:mod:`~sitestack.installs.sources`).

The ``recipe-install`` action (:mod:`sitestack.actions.recipe_install`) drives these; nothing here
imports an action.
"""
