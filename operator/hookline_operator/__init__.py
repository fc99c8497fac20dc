"""The Hookline operator: reconciles WebhookProvider resources (hookline.io/v1alpha1).

- ``main`` runs kopf; ``handlers`` holds the thin kopf handlers and timers;
- ``memo``: the operator's state in kopf memos (pool, Kubernetes client, statistics cache;
  per resource: scaling history, last claim, last scaling outcome);
- ``reconcile``: signing Secret, provider row and worker Deployment made to match the spec;
- ``ownership``: who owns a provider name and which objects may be written (pure);
- ``status`` and ``conditions``: conditions from what was observed (pure);
- ``stats``: one statistics query per tick for every provider, cached for all resources;
- ``tokens``: replay-dlq and rotate-secret annotation requests;
- ``scaling`` (arithmetic), ``budget`` (connection budget), ``resources`` and ``podtemplate``
  (manifests from the chart's template), ``tenancy`` (per-namespace credentials and handler
  modules), ``kube`` (the few Kubernetes API calls beyond kopf's).
"""
