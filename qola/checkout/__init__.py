"""The kernel tree's checkout (QoLA's ``qola checkout``, and ``qola build`` without ``--skip-checkout``).

- :mod:`qola.checkout.choice` — which tree a command uses and whether qola may change it (standard
  library only: the build asks it before the no-op fast path);
- :mod:`qola.checkout.git` — git, run through :mod:`qola.core.proc` with a timeout, never a shell;
- :mod:`qola.checkout.sync` — clone on demand, fetch and check out the pin, sync submodules, apply
  the patch set all-or-nothing, record the result (docs/manifest.md, "Checking out the tree").
"""
