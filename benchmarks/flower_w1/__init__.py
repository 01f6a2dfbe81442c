"""Flower FedAvg on workload W1, run inside Flower's own virtual environment.

This package never imports meshfl: :mod:`flower_w1.w1` rebuilds W1's split, Dirichlet
partition (checked against ``benchmarks/data/w1_partition.json``), MLP and SGD with numpy,
scikit-learn and torch alone. :mod:`flower_w1.engines` runs Flower's legacy gRPC API
(``start_server`` / ``start_client``) and its Ray simulation (``start_simulation``);
``flower_w1/app`` is a Flower App for the deployment engine (SuperLink + SuperNodes +
``flwr run``). ``benchmarks/w1_flower.py`` drives them all.
"""
