"""The ModelDeployment as a lightkube resource, for the sides that talk to the API server (the
operator and the gateway; lightkube is in both extras, not in the base install)."""

from lightkube.generic_resource import create_namespaced_resource

from kvpilot_common.naming import GROUP, KIND, PLURAL, VERSION

ModelDeploymentResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
