"""kvpilot's test support, used by tests/, benchmarks/ and scripts/ alike and never shipped (its
own distribution, kvpilot-testing, installed editable by scripts/setup.sh):

- tiny: tiny random-weight checkpoints, one per supported architecture;
- corpus: the plain English text prompts are sliced from;
- live_server: a real `kvpilot serve` started and stopped by PID;
- adversary, attacks, raw_http: hostile requests against a live server, and what they did;
- helm: the chart rendered offline with Helm's Go SDK;
- crd_rules, crd_messages: a ModelDeployment validated offline as the API server would, in its
  own words (the CRD's tests, and the docs' and the load tester's examples);
- kube: a real Kubernetes control plane on 127.0.0.1 (controlplane), one namespace of it and
  the real operator (cluster), the chart installed with helm (install), the node (node).
"""
