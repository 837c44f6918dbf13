"""Accept-length models. Every model reduces to one distribution over accepted drafts per verify step."""

from simspec.acceptance.models import AcceptanceDistribution, acceptance_distribution

__all__ = ["AcceptanceDistribution", "acceptance_distribution"]
