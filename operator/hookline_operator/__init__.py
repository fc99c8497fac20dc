"""The Hookline operator: reconciles WebhookProvider resources (hookline.io/v1alpha1).

``handlers`` holds the kopf handlers, ``scaling`` the pure autoscaling arithmetic,
``resources`` the Secret and Deployment manifests, ``conditions`` the status
conditions, ``kube`` the few Kubernetes API calls, and ``main`` runs kopf.
"""
