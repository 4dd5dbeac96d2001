"""Development tools: local SuperLink and federation launchers, the experiment
runner's centralized baseline and divergence metrics. Not needed by a Flower app that
uses the strategies.
"""
