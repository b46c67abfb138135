from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers

from portal.api import DateTimeField, StrictSerializerMixin

from ..models import ApiToken, AuditEntry, Invitation, Membership, Project, Role, Tenant


class TenantSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "cost_centre", "contact_email", "status", "created_at"]
        read_only_fields = ["id", "created_at"]


class TenantCreateSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["name", "slug", "cost_centre", "contact_email"]


class ProjectSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    namespace = serializers.CharField(read_only=True)

    class Meta:
        model = Project
        fields = ["id", "tenant", "name", "slug", "namespace", "description", "status", "notebooks_open_to_approvers",
                  "cull_idle_notebooks_by_gpu", "stop_idle_batch_jobs", "created_at"]
        read_only_fields = ["id", "tenant", "namespace", "created_at"]


class ProjectCreateSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    # Resolved against the tenants the caller administers; see ProjectViewSet.create.
    tenant = serializers.SlugField(help_text="Slug of the tenant the project belongs to.")

    class Meta:
        model = Project
        fields = ["tenant", "name", "slug", "description"]
        # Uniqueness is checked by the service, which does not say whether another tenant has the slug
        # (the model's "already exists" would): no unique validator here.
        validators: list = []
        extra_kwargs = {"slug": {"validators": []}}


class MembershipSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "tenant", "project", "role", "created_at"]
        read_only_fields = ["id", "user", "tenant", "project", "created_at"]


class MembershipCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    user = serializers.CharField(
        max_length=150,
        help_text="Username of someone who already has a role in the tenant (ops: any active user). The answer is the "
                  "same for unknown names and other tenants' users; invite newcomers with POST /api/v1/invitations/.",
    )
    tenant = serializers.SlugField()
    project = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=63)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipUpdateSerializer(StrictSerializerMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    invited_by = serializers.CharField(source="invited_by.username", read_only=True, allow_null=True, default=None)
    accepted_by = serializers.CharField(source="accepted_by.username", read_only=True, allow_null=True, default=None)
    link_works = serializers.SerializerMethodField(help_text="The link may be used now (pending and not past its expiry).")

    class Meta:
        model = Invitation
        fields = ["id", "email", "tenant", "project", "role", "status", "link_works", "invited_by", "created_at", "sent_at",
                  "send_count", "expires_at", "accepted_by", "accepted_at", "revoked_at"]
        read_only_fields = fields

    def get_link_works(self, invitation: Invitation) -> bool:
        return invitation.status == Invitation.Status.PENDING and not invitation.overdue


class InvitationCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    email = serializers.EmailField(max_length=254, help_text="Where the single-use link is sent.")
    tenant = serializers.SlugField()
    project = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=63,
                                    help_text="Project slug; leave it out for the tenant-wide tenant admin role.")
    role = serializers.ChoiceField(choices=Role.choices)


class TokenSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "project", "user", "scope", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at", "active"]
        read_only_fields = fields

    def get_active(self, token: ApiToken) -> bool:
        from django.utils import timezone

        return token.revoked_at is None and token.expires_at > timezone.now()


class TokenCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    name = serializers.CharField(max_length=80)
    project = serializers.CharField(max_length=63, help_text="Project slug.")
    scope = serializers.ChoiceField(choices=ApiToken.Scope.choices, default=ApiToken.Scope.READ)
    expires_at = DateTimeField(required=False, help_text="Default: 90 days from now; at most 366 days.")


class TokenCreatedSerializer(TokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(TokenSerializer.Meta):
        fields = TokenSerializer.Meta.fields + ["secret"]
        read_only_fields = fields


class AuditEntrySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = AuditEntry
        fields = [
            "id", "created_at", "actor", "action", "target_type", "target_id", "target_repr",
            "tenant", "project", "before", "after", "client_address",
        ]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_ops = serializers.BooleanField()
    memberships = MembershipSerializer(many=True)
    token = TokenSerializer(allow_null=True)


User = get_user_model()
